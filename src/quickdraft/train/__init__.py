"""Offline training of quickdraft's embedded model pair: corpus, tokenizer, target, draft, evaluation.

Everything here runs on a laptop CPU with no network: the corpus is the Python standard library
source that ships with the interpreter, and every step is a ``quickdraft train`` subcommand.
"""
