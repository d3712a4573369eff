"""Looks at every replica, dead or alive: a dead replica's cache still attracts requests."""
EXERCISE = "9.4"


class PrefixAware:
    def __init__(self, slack=4):
        self.slack = slack

    def choose(self, replicas, prompt_tokens):
        if not any(r.alive for r in replicas):
            raise RuntimeError("no replica is alive")
        lightest = min(r.load for r in replicas)
        near = [i for i, r in enumerate(replicas) if r.load <= lightest + self.slack]
        return max(near, key=lambda i: (replicas[i].cached_tokens, -replicas[i].load, -i))
