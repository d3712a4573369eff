"""Sends preempted requests to the back of the queue, behind requests that arrived after them."""
EXERCISE = "4.4"


def preempt_for(needy, blocks_needed, running, waiting, num_free, block_size):
    victims = []
    while blocks_needed > num_free and running:
        victim = running.pop()
        num_free += math.ceil(victim.computed / block_size)
        victim.computed = 0
        waiting.append(victim)
        victims.append(victim)
        if victim is needy:
            break
    return victims
