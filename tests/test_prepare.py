"""``simlib prepare gpt``: download once, resume, checksum, tokenise to uint16 memory maps -- never the real
network: a small corpus the test makes, served by an http.server thread on 127.0.0.1."""

import hashlib
import http.server
import threading

import numpy as np
import pytest

from simlib.projects.gpt import prepare, text

STORY = (
    "Once upon a time, a little fox found a red ball in the park. She played with it all day and was happy."
    "\n<|endoftext|>\nTom had a small boat. He sailed it on the pond with his dad, and the sun was warm.\n"
    "<|endoftext|>\n"
)


class _Server:
    """Serves ``files`` (name -> bytes) with Range support; ``cut[name] = n``: the next answer for that file stops
    after n bytes (the connection drops mid-body, as a lost Wi-Fi does)."""

    def __init__(self, files):
        self.files, self.cut, self.ranges = files, {}, []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                name = self.path.lstrip("/")
                if name not in outer.files:
                    self.send_error(404)
                    return
                data = outer.files[name]
                rng = self.headers.get("Range")
                outer.ranges.append((name, rng))
                start = int(rng.split("=")[1].split("-")[0]) if rng else 0
                if start >= len(data) and rng:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.end_headers()
                    return
                self.send_response(206 if rng else 200)
                if rng:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                body = data[start:]
                if name in outer.cut:
                    body = body[: outer.cut.pop(name)]
                    self.wfile.write(body)
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    train = (STORY * 400).encode()  # ~84 KB of "stories"
    valid = (STORY.replace("fox", "cat") * 20).encode()
    s = _Server({"train.txt": train, "valid.txt": valid})
    yield s
    s.close()


def test_an_interrupted_download_resumes_with_a_range_request(server, tmp_path):
    data = server.files["train.txt"]
    src = prepare.Source(server.url + "train.txt", sha256=hashlib.sha256(data).hexdigest())
    dest = tmp_path / "train.txt"
    server.cut["train.txt"] = 30_000
    with pytest.raises(OSError, match="run the same command again to resume"):
        prepare.download(src, dest, timeout=10, log=lambda *_: None)
    part = tmp_path / "train.txt.part"
    assert part.stat().st_size == 30_000 and not dest.exists()
    prepare.download(src, dest, timeout=10, log=lambda *_: None)
    assert dest.read_bytes() == data and not part.exists()
    assert server.ranges[-1] == ("train.txt", "bytes=30000-")  # the second request asked for the rest only
    n = len(server.ranges)
    prepare.download(src, dest, timeout=10, log=lambda *_: None)  # done: verified, not downloaded again
    assert len(server.ranges) == n


def test_a_wrong_checksum_is_refused_and_the_file_deleted(server, tmp_path):
    src = prepare.Source(server.url + "valid.txt", sha256="0" * 64)
    dest = tmp_path / "valid.txt"
    with pytest.raises(ValueError, match="is not the expected 0000"):
        prepare.download(src, dest, timeout=10, log=lambda *_: None)
    assert not dest.exists() and not (tmp_path / "valid.txt.part").exists()


def test_offline_says_what_to_do(tmp_path):
    closed = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    port = closed.server_address[1]
    closed.server_close()  # nothing listens there now
    with pytest.raises(OSError, match="Offline\\? Run `simlib prepare gpt` where there is internet"):
        prepare.download(
            prepare.Source(f"http://127.0.0.1:{port}/x.txt"), tmp_path / "x.txt", timeout=5, log=lambda *_: None
        )


def test_prepare_tokenises_to_memory_maps_that_the_gpt_task_reads(server, tmp_path, monkeypatch):
    monkeypatch.setitem(
        prepare.CORPORA,
        "tiny",
        prepare.Corpus(
            "tiny", prepare.Source(server.url + "train.txt"), prepare.Source(server.url + "valid.txt"), "test", "test"
        ),
    )
    folder = prepare.prepare("tiny", tmp_path / "tiny", vocab_size=300, log=lambda *_: None)
    meta = text.read_meta(folder)
    assert meta["sha256"]["train"] == hashlib.sha256(server.files["train.txt"]).hexdigest()
    train, val, tok = text.open_prepared(folder)
    assert train.dtype == np.uint16 and len(train) == meta["train_tokens"] > 1000
    assert tok.decode(train[:40].tolist()).startswith("Once upon a time")
    assert tok.token_to_id(prepare.SPECIAL) is not None  # the story separator is one token
    assert 0 < meta["unigram_cross_entropy"] < np.log(300)

    from simlib.projects.gpt.task import GPTTask

    task = GPTTask(seq_len=16, hidden=32, num_layers=1, num_heads=2, global_batch=4, eval_windows=4, corpus=str(folder))
    assert task.config.vocab_size == tok.get_vocab_size()
    x, y = task.batch(3, part=1, parts=2)
    assert x.shape == (2, 16) and bool((x[:, 1:] == y[:, :-1]).all())
    import pickle

    assert len(pickle.dumps(task)) < 20_000  # the memory maps do not travel
    assert task.evaluate(task.build_model())["eval_loss"] > 0

    # a second run verifies against the recorded checksum: a changed upstream file is refused
    server.files["valid.txt"] = b"changed" + server.files["valid.txt"]
    (folder / "raw" / "valid.txt").unlink()
    with pytest.raises(ValueError, match="sha256"):
        prepare.prepare("tiny", folder, vocab_size=300, log=lambda *_: None)


def test_a_local_file_is_prepared_offline_and_a_missing_folder_says_how(tmp_path):
    src = tmp_path / "my_text.txt"
    src.write_text(STORY * 200)
    folder = prepare.prepare(str(src), tmp_path / "out", vocab_size=280, log=lambda *_: None)
    meta = text.read_meta(folder)
    assert meta["val_tokens"] > 0 and meta["train_tokens"] > 50 * meta["val_tokens"]  # the last 1 % held out
    with pytest.raises(ValueError, match="simlib prepare gpt"):
        text.resolve_folder(str(tmp_path / "nowhere"))


def test_an_interrupted_tokenisation_keeps_the_recorded_checksum(server, tmp_path, monkeypatch):
    """Issue 50 (5): the first run records the download's sha256, then is stopped while tokenising (meta.json,
    which used to hold the only record, is not written yet); a changed upstream file is still refused next time."""
    monkeypatch.setitem(
        prepare.CORPORA,
        "tiny",
        prepare.Corpus(
            "tiny", prepare.Source(server.url + "train.txt"), prepare.Source(server.url + "valid.txt"), "test", "test"
        ),
    )

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(prepare, "_encode_file", stopped)
        with pytest.raises(KeyboardInterrupt):
            prepare.prepare("tiny", tmp_path / "tiny", vocab_size=300, log=lambda *_: None)
    folder = tmp_path / "tiny"
    assert not (folder / "meta.json").exists()
    assert prepare.recorded_checksums(folder)["train"] == hashlib.sha256(server.files["train.txt"]).hexdigest()
    server.files["train.txt"] = b"changed" + server.files["train.txt"]
    (folder / "raw" / "train.txt").unlink()
    with pytest.raises(ValueError, match="sha256"):
        prepare.prepare("tiny", folder, vocab_size=300, log=lambda *_: None)
