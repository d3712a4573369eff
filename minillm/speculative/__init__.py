"""Speculative decoding: a cheap proposer guesses k tokens, the target checks them in one forward.

proposers: ngram.py (prompt lookup), draft.py (a smaller model with its own paged cache), heads.py
(multi-token-prediction heads on the target's last hidden state); verify.py: exact acceptance
(greedy, and the rejection rule for sampling); theory.py: what acceptance buys.
"""
