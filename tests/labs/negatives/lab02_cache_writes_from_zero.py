"""Writes every step's keys and values at position 0 instead of after the cached ones."""
EXERCISE = "2.1"


class KVCache(KVCache):
    def attend(self, layer_idx, q, k, v):
        n = q.shape[0]
        self.k[layer_idx, :n], self.v[layer_idx, :n] = k, v
        return causal_attention(q, self.k[layer_idx, :self.length + n], self.v[layer_idx, :self.length + n])
