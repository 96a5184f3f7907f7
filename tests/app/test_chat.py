"""The chat as a user sees it, with the fake engine: send, stream, stop, regenerate,
edit and resend, copy, system prompt and sampling, failures."""

from __future__ import annotations

import sqlite3
import time

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QAbstractItemView, QApplication, QDialog, QLabel, QLineEdit, QMessageBox

from seqmoe_chat.conversation_dialog import ConversationDialog
from seqmoe_chat.markdown_view import MarkdownView
from seqmoe_chat.store import SamplingSettings
from seqmoe_chat.store.records import ASSISTANT, DONE, FAILED, STOPPED, USER

from seqmoe_chat.worker import EngineWorker

from .fakes import FakeEngine, FakeStats, FakeTokenizer, reply_for
from .waits import model_shown


def send(qtbot, window, text: str) -> None:
    window.composer.set_text(text)
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)


def press(qtbot, key: Qt.Key, modifier: Qt.KeyboardModifier = Qt.KeyboardModifier.NoModifier) -> None:
    """A key press where the keyboard goes: to the widget with the focus."""
    qtbot.keyClick(QApplication.focusWidget(), key, modifier)


def wait_idle(qtbot, window) -> None:
    qtbot.waitUntil(lambda: not window.session.busy, timeout=10_000)


def shown(window) -> list[tuple[str, str]]:
    return [(w.message.role, w.body.source_text) for w in window.chat.widgets.values()]


def stored(window) -> list[tuple[str, str, str]]:
    thread = window.store.thread(window.session.conversation_id)
    return [(e.message.role, e.message.content, e.message.state) for e in thread]


def test_enter_sends_and_the_reply_streams_into_the_chat(qtbot, window, backend) -> None:
    backend.token_delay_s, backend.repeat = 0.01, 8
    send(qtbot, window, "Hello there")
    assert window.composer.text() == ""
    assert shown(window)[0] == (USER, "Hello there")
    assert window.store.thread(window.session.conversation_id)[0].message.content == "Hello there"
    assert not window.composer.send_button.isEnabled() and window.composer.stop_button.isEnabled()
    reply = list(window.chat.widgets.values())[1]
    # The first reply of a process imports PyTorch on the worker thread (seconds on a busy machine).
    qtbot.waitUntil(lambda: "You said" in reply.body.toPlainText(), timeout=30_000)
    assert window.session.busy  # text appears before the reply ends
    wait_idle(qtbot, window)
    expected = "\n\n".join([reply_for([{"role": "user", "content": "Hello there"}])] * 8)
    assert shown(window)[1] == (ASSISTANT, expected)
    assert stored(window) == [(USER, "Hello there", DONE), (ASSISTANT, expected, DONE)]
    assert "tok/s" in reply.note.text() and "hit rate 90.0%" in reply.note.text()
    assert "tok/s" in window.status.speed.text() and "90.0%" in window.status.hit_rate.text()
    assert [s.title for s in window.store.summaries()] == ["Hello there"]
    assert window.composer.send_button.isEnabled()


def test_shift_enter_starts_a_new_line_instead_of_sending(qtbot, window) -> None:
    window.composer.set_text("first line")
    window.composer.input.moveCursor(window.composer.input.textCursor().MoveOperation.End)
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(window.composer.input, "second line")
    assert window.composer.text() == "first line\nsecond line"
    assert window.session.conversation_id is None or not window.store.thread(window.session.conversation_id)


def test_escape_stops_within_a_token_and_keeps_the_partial_reply(qtbot, window, backend) -> None:
    backend.token_delay_s, backend.repeat = 0.02, 20
    send(qtbot, window, "Tell me everything")
    reply = list(window.chat.widgets.values())[1]
    qtbot.waitUntil(lambda: len(reply.body.source_text) > 20, timeout=5000)
    stopped_at = time.perf_counter()
    press(qtbot, Qt.Key.Key_Escape)
    assert not window.session.busy and window.composer.send_button.isEnabled()
    role, content, state = stored(window)[1]
    assert state == STOPPED and content and content == reply.body.source_text
    assert "stopped" in reply.note.text()
    # The engine's statistics of the stopped reply arrive within a token; its stream does not.
    qtbot.waitUntil(lambda: window.store.message(reply.message.id).stats.get("tokens"), timeout=5000)
    assert sum(t > stopped_at for t in backend.token_times) <= 1
    assert window.store.message(reply.message.id).content == content


def test_regenerate_writes_a_new_reply_and_keeps_the_old_one_as_a_version(qtbot, window, backend) -> None:
    send(qtbot, window, "Pick a number")
    wait_idle(qtbot, window)
    first_reply = list(window.chat.widgets.values())[1]
    assert first_reply.regenerate_button.isVisible()
    qtbot.mouseClick(first_reply.regenerate_button, Qt.MouseButton.LeftButton)
    wait_idle(qtbot, window)
    new_reply = list(window.chat.widgets.values())[1]
    assert new_reply.message.id != first_reply.message.id
    assert new_reply.version_label.text() == "2/2" and new_reply.version_label.isVisible()
    assert len(backend.prompts) == 2 and backend.prompts[1] == backend.prompts[0]
    qtbot.mouseClick(new_reply.previous_button, Qt.MouseButton.LeftButton)
    shown_reply = list(window.chat.widgets.values())[1]
    assert shown_reply.message.id == first_reply.message.id and shown_reply.version_label.text() == "1/2"


def test_a_reply_stopped_as_it_ends_keeps_its_text(qtbot, window, backend) -> None:
    send(qtbot, window, "Hello")
    expected = reply_for([{"role": "user", "content": "Hello"}])
    tokens = len(FakeTokenizer().encode(expected))
    deadline = time.monotonic() + 10
    while len(backend.token_times) < tokens and time.monotonic() < deadline:
        time.sleep(0.01)  # no events handled: the worker's stream and result wait in the queue
    time.sleep(0.2)
    window.action_stop.trigger()
    qtbot.waitUntil(lambda: stored(window)[-1] == (ASSISTANT, expected, STOPPED), timeout=5000)
    assert list(window.chat.widgets.values())[-1].body.source_text == expected

def test_editing_a_message_resends_it_and_keeps_the_earlier_version(qtbot, window, backend) -> None:
    send(qtbot, window, "What is 2+2?")
    wait_idle(qtbot, window)
    send(qtbot, window, "And 3+3?")
    wait_idle(qtbot, window)
    first = list(window.chat.widgets.values())[0]
    qtbot.mouseClick(first.edit_button, Qt.MouseButton.LeftButton)
    assert first.editor.isVisible() and first.editor.toPlainText() == "What is 2+2?"
    first.editor.setPlainText("What is 5+5?")
    qtbot.mouseClick(first.save_edit_button, Qt.MouseButton.LeftButton)
    wait_idle(qtbot, window)
    assert [content for _, content, _ in stored(window)] == [
        "What is 5+5?",
        reply_for([{"role": "user", "content": "What is 5+5?"}]),
    ]
    assert backend.prompts[-1] == [{"role": "user", "content": "What is 5+5?"}]
    edited = list(window.chat.widgets.values())[0]
    assert edited.version_label.text() == "2/2"
    qtbot.mouseClick(edited.previous_button, Qt.MouseButton.LeftButton)
    assert [role for role, _ in shown(window)] == [USER, ASSISTANT, USER, ASSISTANT]
    assert shown(window)[2] == (USER, "And 3+3?")


def test_pasted_code_keeps_its_indentation_sent_and_edited(qtbot, window, backend) -> None:
    code = "    def f():\n        return 1"
    send(qtbot, window, "\n  \n" + code + "\n\n")  # only the blank lines around it go
    wait_idle(qtbot, window)
    assert stored(window)[0][1] == code and backend.prompts[-1][-1]["content"] == code
    first = list(window.chat.widgets.values())[0]
    qtbot.mouseClick(first.edit_button, Qt.MouseButton.LeftButton)
    first.editor.setPlainText("  x = 1\n")
    qtbot.mouseClick(first.save_edit_button, Qt.MouseButton.LeftButton)
    wait_idle(qtbot, window)
    assert stored(window)[0][1] == "  x = 1"


def test_an_open_edit_cannot_be_sent_while_a_reply_streams(qtbot, window, backend) -> None:
    # Sending it would have stopped the streaming reply without a word.
    send(qtbot, window, "What is 2+2?")
    wait_idle(qtbot, window)
    first = list(window.chat.widgets.values())[0]
    qtbot.mouseClick(first.edit_button, Qt.MouseButton.LeftButton)
    backend.token_delay_s, backend.repeat = 0.02, 8
    window.session.send("And 3+3?")
    assert window.session.busy and first.editor.isVisible() and not first.save_edit_button.isEnabled()
    wait_idle(qtbot, window)
    assert first.save_edit_button.isEnabled() and stored(window)[-1][2] == DONE


def test_the_system_prompt_and_sampling_of_a_conversation_reach_the_engine(qtbot, window, backend, monkeypatch) -> None:
    def accept(dialog: ConversationDialog) -> int:
        dialog.system_prompt.setPlainText("Answer like a pirate.")
        dialog.sampling.set_value(SamplingSettings(temperature=0.0, top_p=0.5, max_new_tokens=77, seed=42))
        return QDialog.DialogCode.Accepted

    monkeypatch.setattr(ConversationDialog, "exec", accept)
    qtbot.mouseClick(window.header.settings_button, Qt.MouseButton.LeftButton)
    assert "Answer like a pirate." in window.header.system_prompt.toolTip()
    send(qtbot, window, "Ahoy")
    wait_idle(qtbot, window)
    assert backend.prompts[-1][0] == {"role": "system", "content": "Answer like a pirate."}
    sampling = backend.samplings[-1]
    assert sampling.greedy and sampling.top_p == 0.5 and sampling.max_new_tokens == 77 and sampling.seed == 42


def test_cancelling_the_prompt_and_sampling_of_no_chat_makes_none(qtbot, window, monkeypatch) -> None:
    monkeypatch.setattr(ConversationDialog, "exec", lambda dialog: QDialog.DialogCode.Rejected)
    assert window.session.conversation_id is None
    qtbot.mouseClick(window.header.settings_button, Qt.MouseButton.LeftButton)
    assert window.session.conversation_id is None and window.store.summaries() == []


def test_a_long_chat_opens_with_its_last_messages_and_shows_the_earlier_ones_on_request(qtbot, window) -> None:
    conversation = window.store.create("Long")
    parent = None
    for index in range(120):
        parent = window.store.add_message(conversation.id, parent and parent.id, USER if index % 2 == 0 else ASSISTANT,
                                          f"message {index}", DONE)
    window.session.open(conversation.id)
    chat = window.chat
    contents = lambda: [widget.body.source_text for widget in chat.widgets.values()]  # noqa: E731
    assert contents() == [f"message {index}" for index in range(70, 120)]
    assert chat.earlier_button.isVisible() and chat.earlier_button.text() == "Show earlier messages (70 more)"
    qtbot.mouseClick(chat.earlier_button, Qt.MouseButton.LeftButton)
    assert contents() == [f"message {index}" for index in range(20, 120)]
    assert [chat.messages_layout.indexOf(widget) for widget in chat.widgets.values()] == sorted(
        chat.messages_layout.indexOf(widget) for widget in chat.widgets.values())  # on screen in the thread's order
    qtbot.mouseClick(chat.earlier_button, Qt.MouseButton.LeftButton)
    assert contents() == [f"message {index}" for index in range(120)] and not chat.earlier_button.isVisible()
    last = list(chat.widgets.values())[-1]
    assert (last.message.content, last.regenerate_button.isVisibleTo(last)) == ("message 119", True)  # as before


def test_streaming_is_rendered_in_batches_not_per_token(qtbot, window, backend, monkeypatch) -> None:
    renders = []
    original = MarkdownView.set_markdown
    monkeypatch.setattr(MarkdownView, "set_markdown", lambda view, text: (renders.append(text), original(view, text)))
    backend.token_delay_s, backend.repeat = 0.002, 25
    send(qtbot, window, "Talk a lot")
    wait_idle(qtbot, window)
    tokens = window.store.thread(window.session.conversation_id)[1].message.stats["tokens"]
    assert tokens > 200
    assert len(renders) < tokens / 5


def test_a_slow_render_spaces_out_the_next_ones(qtbot, window, backend, monkeypatch) -> None:
    """A long reply takes long to draw: the GUI thread draws it a quarter of its time at most."""
    starts = []
    original = MarkdownView.set_markdown

    def slow(view, text):
        starts.append(time.perf_counter())
        time.sleep(0.06)
        original(view, text)

    monkeypatch.setattr(MarkdownView, "set_markdown", slow)
    backend.token_delay_s, backend.repeat = 0.004, 40
    send(qtbot, window, "Talk a lot")
    wait_idle(qtbot, window)
    streamed = [later - earlier for earlier, later in zip(starts[1:-1], starts[2:-1])]  # between the reply's renders
    assert streamed and min(streamed) >= 0.2  # 0.06 s drawing, then 0.18 s for the rest


def test_copying_a_message_and_a_code_block(qtbot, window) -> None:
    send(qtbot, window, "Show code")
    wait_idle(qtbot, window)
    reply = list(window.chat.widgets.values())[1]
    qtbot.mouseClick(reply.copy_button, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == reply.message.content
    assert "Copy code" in reply.body.toPlainText()
    with qtbot.waitSignal(reply.body.sig_code_copied):
        reply.body.anchorClicked.emit(reply.body.document().find("Copy code").charFormat().anchorHref())
    assert QGuiApplication.clipboard().text() == "print('hello')"


def test_html_in_a_message_is_shown_as_the_text_it_is(qtbot) -> None:
    view = MarkdownView()
    qtbot.addWidget(view)
    view.set_markdown('What does <div class="x"> do? And <br> or <span style="font-size:400px">big</span>?\n\nThat is **all**.')
    assert view.toPlainText() == 'What does <div class="x"> do? And <br> or <span style="font-size:400px">big</span>?\nThat is all.'


def test_a_paragraph_of_thousands_of_emphases_is_shown_as_plain_text(qtbot) -> None:
    # Laid out as Markdown, 50,000 changes of format in one paragraph held the GUI thread for seconds.
    view = MarkdownView()
    qtbot.addWidget(view)
    text = "*a" * 50_000
    view.set_markdown(text)
    assert view.toPlainText() == text and view.source_text == text
    view.set_markdown("*a* " * 100)  # a paragraph of ordinary emphasis is still Markdown
    assert view.toPlainText() == "a " * 99 + "a"

def laid_out_as_plain_text(label: QLabel) -> bool:
    """Whether ``label`` takes the room its text takes as plain text: markup in it shows as typed."""
    plain = QLabel(label.text())
    plain.setFont(label.font())
    plain.setWordWrap(label.wordWrap())
    plain.setTextFormat(Qt.TextFormat.PlainText)
    return plain.heightForWidth(label.width()) == label.heightForWidth(label.width())


def test_html_in_a_title_is_shown_as_the_text_it_is(qtbot, window) -> None:
    send(qtbot, window, "<h1>Big</h1> <b>words</b>")
    wait_idle(qtbot, window)
    title = window.header.title
    assert title.text() == "<h1>Big</h1> <b>words</b>" and laid_out_as_plain_text(title)
    window.delete_conversation(window.session.conversation_id)
    undo = window.sidebar.undo_label
    assert undo.text() == "Deleted “<h1>Big</h1> <b>words</b>”" and laid_out_as_plain_text(undo)


def test_a_copy_code_link_written_in_a_message_copies_nothing(qtbot) -> None:
    view = MarkdownView()
    qtbot.addWidget(view)
    view.set_markdown("[one](copy-code:7) [two](copy-code:x)\n\n```\nreal\n```")
    QGuiApplication.clipboard().setText("kept")
    for link in ("copy-code:7", "copy-code:x", "copy-code:-1"):
        view.anchorClicked.emit(QUrl(link))
    assert QGuiApplication.clipboard().text() == "kept"
    view.anchorClicked.emit(QUrl("copy-code:0"))
    assert QGuiApplication.clipboard().text() == "real"


def test_an_engine_failure_mid_reply_is_shown_and_the_worker_stays_ready(qtbot, window, backend) -> None:
    backend.fail_after = 3
    send(qtbot, window, "Break please")
    wait_idle(qtbot, window)
    reply = list(window.chat.widgets.values())[1]
    role, content, state = stored(window)[1]
    assert state == FAILED and content == "You said: Break "
    assert "failed" in reply.note.text() and "RuntimeError: the fake engine broke" in reply.note.text()
    backend.fail_after = None
    send(qtbot, window, "Try again")
    wait_idle(qtbot, window)
    assert stored(window)[-1][2] == DONE and len(stored(window)) == 4
    # The failed reply's text was part of what the model saw next.
    assert {"role": "assistant", "content": "You said: Break "} in backend.prompts[-1]


def test_a_full_disk_loses_no_reply_and_no_message(qtbot, window, backend, monkeypatch) -> None:
    full = sqlite3.OperationalError("database or disk is full")
    update, add = window.store.update_message, window.store.add_message

    def refuse(*args, **kwargs):
        raise full

    backend.token_delay_s = 0.01
    monkeypatch.setattr(window.store, "update_message", refuse)
    send(qtbot, window, "Hello")
    wait_idle(qtbot, window)
    reply = list(window.chat.widgets.values())[1]
    assert reply.body.source_text == reply_for([{"role": "user", "content": "Hello"}])
    assert window.composer.send_button.isEnabled() and not window.action_stop.isEnabled()
    boxes = window.findChildren(QMessageBox, "errorMessage")
    assert len(boxes) == 1 and "database or disk is full" in boxes[0].text()  # once, not at every save
    boxes[0].close()
    # Space is freed: the next message is saved, and the reply the disk refused with it.
    monkeypatch.setattr(window.store, "update_message", update)
    send(qtbot, window, "Again")
    wait_idle(qtbot, window)
    assert [state for _, _, state in stored(window)] == [DONE] * 4
    assert stored(window)[1][1] == reply_for([{"role": "user", "content": "Hello"}])
    # A message the disk refuses is not sent, and stays in the box.
    monkeypatch.setattr(window.store, "add_message", refuse)
    send(qtbot, window, "Lost?")
    assert window.composer.text() == "Lost?" and not window.session.busy
    qtbot.waitUntil(lambda: len(window.findChildren(QMessageBox, "errorMessage")) == 1, timeout=5000)
    monkeypatch.setattr(window.store, "add_message", add)


def test_a_reply_the_disk_refused_is_shown_whole_after_a_switch_and_sent_with_the_next_message(
    qtbot, window, backend, monkeypatch
) -> None:
    send(qtbot, window, "Elsewhere")
    wait_idle(qtbot, window)
    other = window.session.conversation_id
    window.session.new_conversation()
    update = window.store.update_message
    monkeypatch.setattr(window.store, "update_message", lambda *a, **k: (_ for _ in ()).throw(
        sqlite3.OperationalError("database or disk is full")))
    send(qtbot, window, "Hello")
    wait_idle(qtbot, window)
    this = window.session.conversation_id
    window.session.open(other)
    window.session.open(this)
    reply = list(window.chat.widgets.values())[1]
    answer = reply_for([{"role": "user", "content": "Hello"}])
    assert reply.body.source_text == answer and "Generating" not in reply.note.text()
    monkeypatch.setattr(window.store, "update_message", update)  # space is freed
    send(qtbot, window, "And then?")
    wait_idle(qtbot, window)
    assert {"role": "assistant", "content": answer} in backend.prompts[-1]


def test_an_edit_the_database_refuses_stays_in_its_editor(qtbot, window, monkeypatch) -> None:
    # The editor used to close first: the edited text was gone, and reopened it held the old one.
    send(qtbot, window, "What is 2+2?")
    wait_idle(qtbot, window)
    first = list(window.chat.widgets.values())[0]
    qtbot.mouseClick(first.edit_button, Qt.MouseButton.LeftButton)
    first.editor.setPlainText("What is 5+5?")
    add = window.store.add_message
    monkeypatch.setattr(window.store, "add_message", lambda *a, **k: (_ for _ in ()).throw(sqlite3.OperationalError("database is locked")))
    qtbot.mouseClick(first.save_edit_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(window.findChildren(QMessageBox, "errorMessage")) == 1, timeout=5000)
    assert first.editor.isVisible() and first.editor.toPlainText() == "What is 5+5?" and not window.session.busy
    assert window.focusWidget() is first.editor  # the click on Send gave the keyboard to the chat
    monkeypatch.setattr(window.store, "add_message", add)  # the lock passes: sent again, it goes
    qtbot.mouseClick(first.save_edit_button, Qt.MouseButton.LeftButton)
    wait_idle(qtbot, window)
    assert stored(window)[0][1] == "What is 5+5?" and not any(w.editor.isVisible() for w in window.chat.widgets.values())

def test_new_chat_and_other_versions_the_database_refuses_are_said_and_nothing_changes(qtbot, window) -> None:
    send(qtbot, window, "Pick a number")
    wait_idle(qtbot, window)
    qtbot.mouseClick(list(window.chat.widgets.values())[1].regenerate_button, Qt.MouseButton.LeftButton)
    wait_idle(qtbot, window)
    conversation_id, before = window.session.conversation_id, stored(window)
    window.store.connection.execute("PRAGMA query_only = ON")  # as a full disk or a read-only file
    try:
        for change, act in (
            ("Starting a new chat failed", window.action_new.trigger),
            ("Showing another version failed",
             lambda: qtbot.mouseClick(list(window.chat.widgets.values())[1].previous_button, Qt.MouseButton.LeftButton)),
        ):
            act()
            box = window.findChild(QMessageBox, "errorMessage")
            assert box is not None and box.windowTitle() == change and "readonly database" in box.text()
            box.close()
            qtbot.waitUntil(lambda: window.findChild(QMessageBox, "errorMessage") is None)
            assert window.session.conversation_id == conversation_id and stored(window) == before
            assert list(window.chat.widgets.values())[1].version_label.text() == "2/2"
            assert len(window.store_ids()) == 1
    finally:
        window.store.connection.execute("PRAGMA query_only = OFF")


def test_running_out_of_memory_suggests_a_smaller_vram_budget(qtbot, window, backend) -> None:
    backend.fail_after, backend.failure = 1, MemoryError()
    send(qtbot, window, "Big reply")
    wait_idle(qtbot, window)
    assert "smaller VRAM budget" in list(window.chat.widgets.values())[1].note.text()


def test_a_model_that_fails_to_load_gets_a_dialog_and_the_app_stays_usable(qtbot, make_window, backend) -> None:
    window = make_window(wait_for_model=False, model="broken")
    qtbot.waitUntil(lambda: window.findChild(QMessageBox, "errorMessage") is not None, timeout=5000)
    box = window.findChild(QMessageBox, "errorMessage")
    assert "broken is not a Mixture-of-Experts model" in box.text()
    box.accept()
    assert window.status.model.text() == "No model loaded"
    send(qtbot, window, "Anyone there?")
    wait_idle(qtbot, window)
    assert stored(window)[1][2] == FAILED and "No model is loaded" in stored(window)[1][1] + window.store.thread(
        window.session.conversation_id)[1].message.error
    window.load_model("")
    qtbot.waitUntil(lambda: model_shown(window), timeout=5000)
    send(qtbot, window, "Now?")
    wait_idle(qtbot, window)
    assert stored(window)[-1][2] == DONE
    assert window.status.model.text() == "seqmoe-demo"


def test_an_engine_that_fails_once_loaded_is_closed_and_said_like_any_load(qtbot, make_window, backend, monkeypatch) -> None:
    def unreadable(engine: FakeEngine) -> int:
        raise RuntimeError("predictor file truncated")

    monkeypatch.setattr(FakeEngine, "max_horizon", unreadable)
    window = make_window(wait_for_model=False)
    qtbot.waitUntil(lambda: window.findChild(QMessageBox, "errorMessage") is not None, timeout=5000)
    box = window.findChild(QMessageBox, "errorMessage")
    assert "predictor file truncated" in box.text()
    box.close()
    assert window.status.model.text() == "No model loaded" and window.model_bar.progress.isHidden()
    assert backend.engines[0].closed
    send(qtbot, window, "Anyone there?")  # loads again, which fails again: the reply says so
    wait_idle(qtbot, window)
    assert stored(window)[1][2] == FAILED and len(backend.engines) == 2 and backend.engines[1].closed


def test_a_reply_waiting_for_a_load_that_never_ends_fails_instead_of_asking_again_and_again(
        qtbot, make_window, monkeypatch) -> None:
    monkeypatch.setattr(EngineWorker, "load", lambda worker, request_id, model, options: None)  # its word never comes
    window = make_window(wait_for_model=False)
    asked = []
    window.client.sig_generate_requested.connect(lambda *args: asked.append(args[0]))
    send(qtbot, window, "Hello?")
    wait_idle(qtbot, window)
    assert len(asked) == 1 and window.store.thread(window.session.conversation_id)[1].message.state == FAILED
    assert "No model is loaded" in list(window.chat.widgets.values())[1].note.text()


def test_a_reply_whose_statistics_cannot_be_read_fails_and_keeps_its_text(qtbot, window, monkeypatch) -> None:
    monkeypatch.setattr(FakeStats, "as_dict", lambda stats: 1 / 0)
    send(qtbot, window, "Hello")
    wait_idle(qtbot, window)
    assert stored(window)[1] == (ASSISTANT, reply_for([{"role": "user", "content": "Hello"}]), FAILED)
    assert "ZeroDivisionError" in list(window.chat.widgets.values())[1].note.text()
    send(qtbot, window, "Again")  # the worker is ready for the next reply
    wait_idle(qtbot, window)
    assert stored(window)[3][2] == FAILED and window.composer.send_button.isEnabled()


def test_only_a_model_that_loaded_is_opened_at_the_next_start_and_listed(qtbot, make_window, backend) -> None:
    window = make_window()
    window.load_model("/models/other-moe")
    qtbot.waitUntil(lambda: model_shown(window) and window.client.model.path == "/models/other-moe", timeout=5000)
    bar = window.model_bar.models
    assert [bar.itemData(i) for i in range(1, 2)] == ["/models/other-moe"]  # listed at once, first after the demo
    window.load_model("broken")
    qtbot.waitUntil(lambda: window.findChild(QMessageBox, "errorMessage") is not None, timeout=5000)
    window.findChild(QMessageBox, "errorMessage").accept()
    window.close()
    restarted = make_window()  # the model loaded last, again; no error
    assert restarted.findChild(QMessageBox, "errorMessage") is None
    assert restarted.client.model.path == "/models/other-moe"
    assert restarted.settings.recent_models == ["/models/other-moe"]
    bar = restarted.model_bar.models
    assert "broken" not in [bar.itemData(i) for i in range(bar.count())]


def test_a_model_from_the_hugging_face_cache_goes_by_its_repository_not_its_commit(qtbot, make_window, backend) -> None:
    snapshot = "/cache/models--acme--tiny-moe/snapshots/0123abcd"  # its folder's own name is the commit
    window = make_window()
    window.load_model(snapshot)
    qtbot.waitUntil(lambda: model_shown(window) and window.client.model.path == snapshot, timeout=5000)
    assert window.status.model.text() == "acme/tiny-moe"
    send(qtbot, window, "Hello")
    wait_idle(qtbot, window)
    assert window.store.get(window.session.conversation_id).model_id == "acme/tiny-moe"
    window.close()
    restarted = make_window()  # listed among the recent models by the same name
    bar = restarted.model_bar.models
    assert bar.itemText(bar.findData(snapshot)) == "acme/tiny-moe"


def test_a_model_refused_by_its_checks_leaves_the_model_before_loaded_and_chosen(qtbot, window, backend) -> None:
    window.load_model("/models/other-moe")
    qtbot.waitUntil(lambda: model_shown(window) and window.client.model.path == "/models/other-moe", timeout=5000)
    window.load_model("broken")
    qtbot.waitUntil(lambda: window.findChild(QMessageBox, "errorMessage") is not None, timeout=5000)
    box = window.findChild(QMessageBox, "errorMessage")
    assert "broken is not a Mixture-of-Experts model" in box.text() and "other-moe is still loaded" in box.text()
    box.accept()
    assert window.client.model.path == "/models/other-moe" and window.status.model.text() == "other-moe"
    assert window.model_bar.chosen_model() == "/models/other-moe" and window.model_bar.unload_button.isEnabled()
    send(qtbot, window, "Still there?")
    wait_idle(qtbot, window)
    assert stored(window)[-1][2] == DONE and len(backend.engines) == 2  # no load in between
    window.load_model("too-big")  # fails once the model before went: none is left
    qtbot.waitUntil(lambda: window.findChild(QMessageBox, "errorMessage") is not None, timeout=5000)
    box = window.findChild(QMessageBox, "errorMessage")
    assert "still loaded" not in box.text()
    box.accept()
    assert window.client.model is None and window.status.model.text() == "No model loaded"


def test_a_model_loaded_while_a_reply_streams_waits_for_it_and_says_so(qtbot, window, backend) -> None:
    backend.token_delay_s, backend.repeat = 0.02, 8
    send(qtbot, window, "Hello there")
    qtbot.waitUntil(lambda: len(backend.token_times) > 2, timeout=5000)
    window.load_model("/models/other-moe")
    assert window.model_bar.stage.toolTip() == "Waiting for the reply to end"
    wait_idle(qtbot, window)
    assert stored(window)[-1][2] == DONE  # the reply ran to its end, then the model changed
    qtbot.waitUntil(lambda: model_shown(window) and window.client.model.path == "/models/other-moe", timeout=5000)


def test_a_rename_in_progress_survives_a_reply_ending(qtbot, window, backend) -> None:
    send(qtbot, window, "hello")
    wait_idle(qtbot, window)
    backend.token_delay_s, backend.repeat = 0.02, 6
    send(qtbot, window, "and more")
    window.rename_current()
    editor = window.sidebar.list.viewport().findChild(QLineEdit)
    editor.setText("Greetings")
    wait_idle(qtbot, window)  # the reply's end refreshes the list
    assert window.sidebar.list.state() == QAbstractItemView.State.EditingState and editor.text() == "Greetings"
    qtbot.keyClick(editor, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: window.sidebar.list.item(0).text() == "Greetings", timeout=2000)
    assert window.store.get(window.session.conversation_id).title == "Greetings"


def test_a_folder_chosen_again_is_selected_not_listed_twice(qtbot, monkeypatch) -> None:
    from seqmoe_chat import model_bar

    bar = model_bar.ModelBar()
    qtbot.addWidget(bar)
    monkeypatch.setattr(model_bar.QFileDialog, "getExistingDirectory", lambda *args: "/models/mine")
    requested = []
    bar.sig_load_requested.connect(requested.append)
    for _ in range(2):
        bar.models.activated.emit(bar.models.findData(model_bar._OTHER))
    listed = [bar.models.itemData(i) for i in range(bar.models.count())]
    assert listed.count("/models/mine") == 1 and bar.chosen_model() == "/models/mine"
    assert requested == ["/models/mine", "/models/mine"]


def test_loading_shows_progress_and_can_be_cancelled(qtbot, make_window, backend) -> None:
    backend.load_delay_s = 0.3
    window = make_window(wait_for_model=False)
    bar = window.model_bar
    qtbot.waitUntil(lambda: bar.progress.isVisible() and bar.stage.text() == "Finding the model", timeout=5000)
    qtbot.mouseClick(bar.cancel_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not bar.progress.isVisible(), timeout=5000)
    assert window.client.model is None and "cancelled" in window.status.currentMessage()
    assert backend.engines == []


def test_stopping_a_reply_that_waits_for_the_model_does_not_cancel_the_loading(qtbot, make_window, backend) -> None:
    backend.load_delay_s = 0.2
    window = make_window(wait_for_model=False)
    send(qtbot, window, "Hello while you load")
    window.action_stop.trigger()
    qtbot.waitUntil(lambda: model_shown(window), timeout=5000)
    assert stored(window)[-1][2] == STOPPED and "cancelled" not in window.status.currentMessage()
    send(qtbot, window, "Now?")
    wait_idle(qtbot, window)
    assert stored(window)[-1][2] == DONE and len(backend.engines) == 1


def test_a_reply_waiting_for_the_model_waits_for_the_one_chosen_meanwhile(qtbot, make_window, backend) -> None:
    backend.load_delay_s = 0.2
    window = make_window(wait_for_model=False)
    send(qtbot, window, "Hello while you load")
    window.load_model("")  # another choice while the first load runs: that one is given up
    wait_idle(qtbot, window)
    assert stored(window)[-1][2] == DONE and model_shown(window)


def test_giving_up_models_chosen_while_a_reply_streams_lets_the_reply_finish(qtbot, window, backend) -> None:
    backend.token_delay_s, backend.repeat = 0.02, 4
    send(qtbot, window, "Tell me everything")
    reply = list(window.chat.widgets.values())[1]
    qtbot.waitUntil(lambda: len(reply.body.source_text) > 10, timeout=5000)
    # Both loads wait behind the reply; the second gives up the first, Cancel Loading the second.
    window.load_model("another-model")
    window.load_model("a-third-model")
    window.action_cancel_load.trigger()
    wait_idle(qtbot, window)
    assert stored(window)[1][2] == DONE and stored(window)[1][1] == reply.body.source_text
    assert [engine.loaded.path.name for engine in backend.engines] == ["seqmoe-demo"]


def test_a_long_loading_stage_is_elided_and_does_not_widen_the_window(qtbot, make_window, backend) -> None:
    backend.load_delay_s = 1.0  # the next stage does not come while the test looks
    window = make_window(wait_for_model=False)
    bar = window.model_bar
    qtbot.waitUntil(lambda: bar.stage.text() == "Finding the model", timeout=5000)  # room to show it whole
    short = window.minimumSizeHint().width()
    stage = "Keeping the experts of every one of the model's forty-eight MoE layers in host memory"
    bar.show_loading(stage, 0.7)
    window.resize(short + 80, window.height())  # room for a few words of it
    qtbot.waitUntil(lambda: bar.stage.text().endswith("…"), timeout=5000)
    assert window.minimumSizeHint().width() == short and bar.stage.toolTip() == stage


def test_sending_right_after_unload_is_clicked_loads_the_model_again(qtbot, window, backend) -> None:
    backend.load_delay_s = 0.2
    qtbot.mouseClick(window.model_bar.unload_button, Qt.MouseButton.LeftButton)
    send(qtbot, window, "Wake up")  # before the worker has said that the model is gone
    qtbot.waitUntil(lambda: backend.engines[0].closed, timeout=5000)
    qtbot.wait(50)  # the worker's word that it unloaded has arrived
    assert window.model_bar.progress.isVisible() and window.status.model.text().startswith("Loading")
    wait_idle(qtbot, window)
    assert stored(window)[-1][2] == DONE and len(backend.engines) == 2


def test_the_model_menu_offers_what_the_model_bar_can_do(qtbot, window, backend) -> None:
    # Unload Model and Cancel Loading stayed enabled with no model, and with nothing loading.
    def offered() -> tuple[bool, bool, bool]:
        return window.action_load.isEnabled(), window.action_unload.isEnabled(), window.action_cancel_load.isEnabled()

    assert offered() == (True, True, False)
    window.action_unload.trigger()
    qtbot.waitUntil(lambda: window.status.model.text() == "No model loaded", timeout=5000)
    assert offered() == (True, False, False)
    backend.load_delay_s = 0.3
    window.action_load.trigger()
    qtbot.waitUntil(lambda: window.model_bar.progress.isVisible(), timeout=5000)
    assert offered() == (False, False, True)
    qtbot.waitUntil(lambda: offered() == (True, True, False), timeout=5000)

def test_sending_after_unloading_loads_the_model_again(qtbot, window, backend) -> None:
    qtbot.mouseClick(window.model_bar.unload_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.status.model.text() == "No model loaded", timeout=5000)
    assert window.client.model is None and backend.engines[0].closed
    send(qtbot, window, "Wake up")
    wait_idle(qtbot, window)
    assert stored(window)[-1][2] == DONE and len(backend.engines) == 2
