"""Transcripts: conversations written out as Markdown, JSON, HTML or plain text, and JSON
read back in. No Qt in here."""
