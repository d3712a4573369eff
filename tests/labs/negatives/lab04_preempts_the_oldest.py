"""Preempts the oldest running request, throwing away the most work."""
EXERCISE = "4.4"


def preempt_for(needy, blocks_needed, running, waiting, num_free, block_size):
    victims = []
    while blocks_needed > num_free and running:
        victim = running.pop(0)
        num_free += math.ceil(victim.computed / block_size)
        victim.computed = 0
        waiting.appendleft(victim)
        victims.append(victim)
        if victim is needy:
            break
    return victims
