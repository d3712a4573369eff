"""How the bundled models, tiny's speculative heads and the distilled draft are trained
(`python -m minillm train [heads | distill]`): bundled.py, heads.py, draft.py, their corpus
(corpus.py: the standard library, split by file) and the model cards (modelcard.py).
Nothing is imported here: the engine never loads training code."""
