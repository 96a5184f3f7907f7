"""SeqMoE Chat: the desktop chat app on top of the ``seqmoe`` engine.

``store`` and ``transcripts`` hold the Qt-free parts (the chat database, export and
import); the other modules are the PySide6 user interface and the engine worker.
"""
