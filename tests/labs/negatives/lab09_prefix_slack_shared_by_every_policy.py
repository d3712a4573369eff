"""The slack is stored on the class, not on the policy: the last PrefixAware made sets it for every one."""
EXERCISE = "9.4"


class PrefixAware:
    slack = 4

    def __init__(self, slack=4):
        PrefixAware.slack = slack

    def choose(self, replicas, prompt_tokens):
        alive = [i for i, r in enumerate(replicas) if r.alive]
        if not alive:
            raise RuntimeError("no replica is alive")
        lightest = min(replicas[i].load for i in alive)
        candidates = [i for i in alive if replicas[i].load <= lightest + PrefixAware.slack]
        return max(candidates, key=lambda i: (replicas[i].cached_tokens, -replicas[i].load, -i))
