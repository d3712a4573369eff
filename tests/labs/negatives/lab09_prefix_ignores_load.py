"""Pure cache affinity: the biggest hit among alive replicas, however busy."""
EXERCISE = "9.4"


class PrefixAware:
    def __init__(self, slack=4):
        self.slack = slack

    def choose(self, replicas, prompt_tokens):
        alive = [i for i, r in enumerate(replicas) if r.alive]
        if not alive:
            raise RuntimeError("no replica is alive")
        return max(alive, key=lambda i: (replicas[i].cached_tokens, -replicas[i].load, -i))
