"""The chat database: conversations, messages and settings in SQLite. No Qt in here."""

from .conversations import ConversationStore
from .database import DATABASE_NAME, DatabaseUnavailable, OpenedDatabase, open_database
from .records import Conversation, ConversationSummary, Message, SamplingSettings, ThreadEntry
from .settings import EngineOptions, Settings, SettingsStore

__all__ = [
    "DATABASE_NAME",
    "Conversation",
    "ConversationStore",
    "ConversationSummary",
    "DatabaseUnavailable",
    "EngineOptions",
    "Message",
    "OpenedDatabase",
    "SamplingSettings",
    "Settings",
    "SettingsStore",
    "ThreadEntry",
    "open_database",
]
