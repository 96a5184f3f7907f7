"""What a message's text cannot do to the chat: read files, freeze the window with a long line,
or send the keyboard to an unrelated control."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QImage, QTextOption
from PySide6.QtWidgets import QApplication

from seqmoe_chat.composer import Composer
from seqmoe_chat.markdown_view import MarkdownView

from .test_chat import send, wait_idle

ANYWHERE = QTextOption.WrapMode.WrapAnywhere
AT_WORDS = QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere
UNBROKEN = '{"data":"' + "QUJD" * 2000 + '"}'  # minified JSON holding base64: no space in 8,000 characters
PROSE = "An ordinary reply, with words. " * 100
JAPANESE = "これは日本語の文章です。空白はなくても、どの二文字の間でも改行できます。" * 40  # 1,440 characters, no space


def test_an_image_in_a_message_is_never_read(qtbot, tmp_path: Path) -> None:
    # Qt read the image's path on the GUI thread: a FIFO hung the window, /dev/zero ended the app.
    path = tmp_path / "tall.png"
    image = QImage(40, 600, QImage.Format.Format_RGB32)
    image.fill(QColor("red"))
    image.save(str(path))
    view = MarkdownView()
    qtbot.addWidget(view)
    view.resize(500, 100)
    view.set_markdown(f"Here is the chart:\n\n![chart]({path})\n\nSee [the docs](https://example.org).")
    view.grab()  # painted, as on screen
    assert view.height() < 150  # read, the picture is 600 px tall
    assert view.document().find("the docs").charFormat().anchorHref() == "https://example.org"


def test_a_long_run_without_spaces_is_broken_anywhere_in_the_composer(qtbot) -> None:
    # Broken at word boundaries, 212 KiB of minified JSON took 2.9 s to paste and 1.1 s a keystroke.
    composer = Composer()
    qtbot.addWidget(composer)
    box = composer.input
    modes_while_inserting = []
    box.document().contentsChange.connect(lambda *_: modes_while_inserting.append(box.wordWrapMode()))
    QGuiApplication.clipboard().setText(UNBROKEN)
    box.paste()
    assert composer.text() == UNBROKEN and modes_while_inserting == [ANYWHERE]
    composer.clear()
    assert box.wordWrapMode() == AT_WORDS
    composer.set_text(PROSE)
    assert box.wordWrapMode() == AT_WORDS
    composer.set_text(UNBROKEN)
    assert box.wordWrapMode() == ANYWHERE


def test_a_message_with_a_long_run_without_spaces_is_broken_anywhere_and_others_at_words(qtbot) -> None:
    view = MarkdownView()
    qtbot.addWidget(view)
    view.set_markdown(PROSE)
    assert view.wordWrapMode() == AT_WORDS
    view.set_markdown(f"Here it is:\n\n{UNBROKEN}\n")
    assert view.wordWrapMode() == ANYWHERE and UNBROKEN in view.toPlainText()
    view.set_plain(PROSE)
    assert view.wordWrapMode() == AT_WORDS and view.toPlainText() == PROSE
    view.set_plain(UNBROKEN)
    assert view.wordWrapMode() == ANYWHERE and view.toPlainText() == UNBROKEN


def test_after_a_long_run_is_deleted_the_composer_still_breaks_anywhere_until_it_is_cleared(qtbot, window) -> None:
    # Back at word boundaries once the run was deleted, Undo brought it back laid out at word
    # boundaries before the box was told: 1.7 s for 212 KiB.
    box = window.composer.input
    QGuiApplication.clipboard().setText(UNBROKEN)
    box.paste()
    qtbot.keyClick(box, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClick(box, Qt.Key.Key_Delete)
    assert box.toPlainText() == "" and box.wordWrapMode() == ANYWHERE
    modes_while_inserting = []
    box.document().contentsChange.connect(lambda *_: modes_while_inserting.append(box.wordWrapMode()))
    qtbot.keyClick(box, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    assert box.toPlainText() == UNBROKEN and modes_while_inserting == [ANYWHERE]
    qtbot.keyClick(box, Qt.Key.Key_Return)  # sent, the box is cleared
    assert window.chat.widgets and box.toPlainText() == "" and box.wordWrapMode() == AT_WORDS
    wait_idle(qtbot, window)


def test_chinese_or_japanese_without_spaces_is_broken_at_words(qtbot) -> None:
    # Counted as a run without spaces, it had a message broken anywhere, splitting its Latin words,
    # though Qt breaks it between any two characters as fast.
    view = MarkdownView()
    qtbot.addWidget(view)
    view.set_markdown(f"{JAPANESE}\n\nSee the seqmoe documentation.\n")
    assert view.wordWrapMode() == AT_WORDS
    view.set_markdown(f"{JAPANESE}\n\n{UNBROKEN}\n")
    assert view.wordWrapMode() == ANYWHERE
    composer = Composer()
    qtbot.addWidget(composer)
    composer.set_text(JAPANESE)
    assert composer.input.wordWrapMode() == AT_WORDS


def test_clicking_send_or_stop_leaves_the_keyboard_in_the_message_box(qtbot, window, backend) -> None:
    # Disabled once clicked, each button passed the focus on to the model list, where typing "o"
    # opened a folder dialog.
    backend.token_delay_s, backend.repeat = 0.02, 50
    box = window.composer.input
    window.composer.set_text("first question")
    qtbot.mouseClick(window.composer.send_button, Qt.MouseButton.LeftButton)
    assert QApplication.focusWidget() is box
    qtbot.waitUntil(lambda: window.session.busy)
    qtbot.mouseClick(window.composer.stop_button, Qt.MouseButton.LeftButton)
    wait_idle(qtbot, window)
    assert QApplication.focusWidget() is box
    send(qtbot, window, "second question")
    qtbot.waitUntil(lambda: window.session.busy)
    window.composer.stop_button.setFocus()  # reached with Tab
    qtbot.keyClick(window.composer.stop_button, Qt.Key.Key_Space)
    wait_idle(qtbot, window)
    assert QApplication.focusWidget() is box


def test_sending_or_cancelling_an_edit_leaves_the_keyboard_in_the_chat(qtbot, window, backend) -> None:
    # Sent, the edit's Send button vanished and passed the focus to the sidebar's New chat: the
    # next Space started a new chat.
    send(qtbot, window, "first")
    wait_idle(qtbot, window)
    message = list(window.chat.widgets.values())[0]
    qtbot.mouseClick(message.edit_button, Qt.MouseButton.LeftButton)
    message.cancel_edit_button.setFocus()  # reached with Tab
    qtbot.keyClick(message.cancel_edit_button, Qt.Key.Key_Space)
    assert not message.editor.isVisible() and QApplication.focusWidget() is message.edit_button
    qtbot.mouseClick(message.edit_button, Qt.MouseButton.LeftButton)
    message.editor.setPlainText("first, edited")
    qtbot.mouseClick(message.save_edit_button, Qt.MouseButton.LeftButton)
    assert QApplication.focusWidget() is window.chat
    wait_idle(qtbot, window)
    message = list(window.chat.widgets.values())[0]
    qtbot.mouseClick(message.edit_button, Qt.MouseButton.LeftButton)
    message.editor.setPlainText("first, edited again")
    message.save_edit_button.setFocus()  # reached with Tab
    qtbot.keyClick(message.save_edit_button, Qt.Key.Key_Space)
    assert QApplication.focusWidget() is window.chat
    conversation = window.session.conversation_id
    qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_Space)
    assert window.session.conversation_id == conversation and len(window.store.summaries()) == 1
    wait_idle(qtbot, window)


def test_switching_versions_or_regenerating_leaves_the_keyboard_in_the_chat(qtbot, window, backend) -> None:
    # The chat shown again hid the message holding the focus, and Qt passed it on to the sidebar's
    # New chat: the next Space started a new chat.
    send(qtbot, window, "first")
    wait_idle(qtbot, window)
    reply = list(window.chat.widgets.values())[1]
    reply.regenerate_button.setFocus()  # reached with Tab
    qtbot.keyClick(reply.regenerate_button, Qt.Key.Key_Space)
    assert QApplication.focusWidget() is window.chat
    wait_idle(qtbot, window)
    reply = list(window.chat.widgets.values())[1]
    reply.previous_button.setFocus()  # reached with Tab
    qtbot.keyClick(reply.previous_button, Qt.Key.Key_Space)
    assert list(window.chat.widgets.values())[1].version_label.text() == "1/2"
    assert QApplication.focusWidget() is window.chat
    conversation = window.session.conversation_id
    qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_Space)
    assert window.session.conversation_id == conversation and len(window.store.summaries()) == 1
