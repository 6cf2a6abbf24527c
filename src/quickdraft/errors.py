"""Errors quickdraft raises for bad input: each says what was wrong and what to do."""


class QuickdraftError(ValueError):
    """Base class: bad input, reported with a message meant for the user."""


class UnsupportedModelError(QuickdraftError):
    pass


class ModelFormatError(QuickdraftError):
    """A model file is missing, corrupt, or in a format we refuse to load (pickle)."""


class ModelNotFoundError(QuickdraftError):
    pass


class VocabularyMismatchError(QuickdraftError):
    pass


class ContextLengthError(QuickdraftError):
    pass


class SamplingParamsError(QuickdraftError):
    pass
