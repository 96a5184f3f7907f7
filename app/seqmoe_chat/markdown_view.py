"""A message body: Markdown through Qt's own reader, code highlighted, as tall as its text.

Each closed code block is followed by a "Copy code" link that copies exactly the code
of that block.
"""

from __future__ import annotations

import math

from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtGui import (
    QDesktopServices,
    QGuiApplication,
    QImage,
    QPalette,
    QResizeEvent,
    QTextDocument,
)
from PySide6.QtWidgets import QFrame, QSizePolicy, QTextBrowser, QWidget

from .code_highlight import highlight_code_blocks
from .text_wrap import fit_wrap_mode
from .transcripts.fences import code_blocks, split_fences

COPY_CODE_SCHEME = "copy-code"
# HTML in a message is shown as the text it is: a model that explains <div> or <script> meant the
# tags, and rendered they hid the text after them (or drew it 400 px tall).
MARKDOWN_FEATURES = QTextDocument.MarkdownFeature.MarkdownDialectGitHub | QTextDocument.MarkdownFeature.MarkdownNoHTML
MAX_FORMATS_PER_PARAGRAPH = 2000
"""Qt lays a paragraph out in a time that grows with the square of its changes of format: a message
of 100,000 characters alternating ``*a`` (50,000 of them) took 3 s on the GUI thread, 40,000 such
characters 0.6 s, while 115,000 characters of ordinary Markdown took 0.05 s. A message with a
paragraph of more than this many is shown as plain text; real paragraphs have a few dozen."""


def _no_resource() -> QImage:
    image = QImage(1, 1, QImage.Format.Format_ARGB32)
    image.fill(Qt.GlobalColor.transparent)
    return image


_NO_RESOURCE = _no_resource()


class MarkdownView(QTextBrowser):
    sig_code_copied = Signal(int)  # index of the code block

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(self.verticalScrollBarPolicy().ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(self.horizontalScrollBarPolicy().ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.viewport().setAutoFillBackground(False)
        self.document().setDocumentMargin(2)
        self.anchorClicked.connect(self._on_anchor)
        self._text = ""
        self._markdown = True

    @property
    def source_text(self) -> str:
        return self._text

    def set_markdown(self, text: str) -> None:
        self._text, self._markdown = text, True
        fit_wrap_mode(self, text)
        document = self.document()
        document.setMarkdown(_with_copy_links(text), MARKDOWN_FEATURES)
        if _has_a_paragraph_of_too_many_formats(document):
            self.setPlainText(text)
        else:
            # Light text means a dark theme (the transparent background says nothing).
            dark = self.palette().color(QPalette.ColorRole.Text).lightness() > 128
            highlight_code_blocks(document, dark=dark)
        self._fit_height()

    def set_plain(self, text: str) -> None:
        self._text, self._markdown = text, False
        fit_wrap_mode(self, text)
        self.setPlainText(text)
        self._fit_height()

    def copy_code(self, index: int) -> None:
        QGuiApplication.clipboard().setText(code_blocks(self._text)[index].text)
        self.sig_code_copied.emit(index)

    def loadResource(self, resource_type: int, name: QUrl) -> QImage:
        # A message's image is never read: Qt read its path on the GUI thread (a FIFO hung the
        # window, /dev/zero ended the app, a big file was read again at every streamed redraw). A
        # null answer makes Qt open the path itself; an empty image takes no room. Links do not
        # come here and still work.
        return _NO_RESOURCE

    def _on_anchor(self, url: QUrl) -> None:
        if url.scheme() == COPY_CODE_SCHEME:
            # A message may hold a link of this scheme itself: only a code block's own is followed.
            index = url.path()
            if index.isdigit() and int(index) < len(code_blocks(self._text)):
                self.copy_code(int(index))
        elif url.scheme() in ("http", "https", "mailto"):
            QDesktopServices.openUrl(url)

    def _fit_height(self) -> None:
        document = self.document()
        document.setTextWidth(self.viewport().width())
        margins = self.contentsMargins()
        height = math.ceil(document.size().height()) + margins.top() + margins.bottom()
        if height != self.height():
            self.setFixedHeight(height)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():
            self._fit_height()

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() == event.Type.PaletteChange and self._markdown and self._text:
            self.set_markdown(self._text)


def _has_a_paragraph_of_too_many_formats(document: QTextDocument) -> bool:
    # Run at every streamed update of a reply: a block has no more changes of format than
    # characters, so only long ones are asked for theirs (a list of them, built in Python).
    block = document.firstBlock()
    while block.isValid():
        if block.length() > MAX_FORMATS_PER_PARAGRAPH and len(block.textFormats()) > MAX_FORMATS_PER_PARAGRAPH:
            return True
        block = block.next()
    return False


def _with_copy_links(markdown: str) -> str:
    parts = []
    index = 0
    for segment in split_fences(markdown):
        parts.append(segment.source)
        if segment.code and segment.closed:
            separator = "\n" if segment.source.endswith("\n") else "\n\n"
            parts.append(f"{separator}[Copy code]({COPY_CODE_SCHEME}:{index})\n\n")
            index += 1
    return "".join(parts)
