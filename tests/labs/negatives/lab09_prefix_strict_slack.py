"""Candidates strictly within slack (load < lightest + slack): a replica exactly at the bound is left out."""
EXERCISE = "9.4"


class PrefixAware:
    def __init__(self, slack=4):
        self.slack = slack

    def choose(self, replicas, prompt_tokens):
        alive = [i for i, r in enumerate(replicas) if r.alive]
        if not alive:
            raise RuntimeError("no replica is alive")
        lightest = min(replicas[i].load for i in alive)
        near = [i for i in alive if replicas[i].load < lightest + self.slack] or [alive[0]]
        return max(near, key=lambda i: (replicas[i].cached_tokens, -replicas[i].load, -i))
