"""Drafters: one protocol (base.Drafter), several ways to guess the target's next tokens."""

from quickdraft.drafters.base import Draft, Drafter, DraftContext

__all__ = ["Draft", "Drafter", "DraftContext"]
