"""How the bundled models, tiny's speculative heads and the distilled draft are trained
(`python -m minillm train [heads | distill]`): bundled.py, train_heads.py, train_draft.py,
train_speculator.py, their corpus
(corpus.py: the standard library, split by file) and the model cards (modelcard.py).
Nothing is imported here: the engine never loads training code."""
