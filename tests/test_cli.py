"""The ``exgrpo`` command's own surface: every subcommand's ``--help`` says what it does and what each
option defaults to, and ``exgrpo train`` on a comparison file says which arm it trains (``--arm``)."""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from exgrpo.cli import build_parser, main
from exgrpo.config import ConfigError

VLLM = "experiments/verl-tiny-vllm.yaml"
ROOT = Path(__file__).resolve().parents[1]


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


@pytest.mark.parametrize("name", sorted(_subcommands()))
def test_every_subcommands_help_says_what_it_does_and_each_options_default(name, capsys):
    parser = _subcommands()[name]
    assert parser.description, f"`exgrpo {name} --help` has no description of what the command does"
    undocumented = [a.option_strings or [a.dest] for a in parser._actions
                    if not isinstance(a, argparse._HelpAction) and not a.help]
    assert not undocumented, f"`exgrpo {name}` options without help: {undocumented}"
    # an option that takes a value says what it is when not given (a flag is off unless given)
    no_default = [a.option_strings or [a.dest] for a in parser._actions
                  if a.nargs != 0 and not a.required and "default" not in (a.help or "")]
    assert not no_default, f"`exgrpo {name}` options whose help gives no default: {no_default}"
    with pytest.raises(SystemExit) as done:
        main([name, "--help"])
    assert done.value.code == 0
    shown = "".join(capsys.readouterr().out.split())  # as wrapped, without the spaces (argparse wraps at hyphens)
    assert "".join(parser.description.split()) in shown
    for action in parser._actions:
        if action.default not in (None, False, argparse.SUPPRESS) and not isinstance(action.default, list):
            assert "".join(str(action.default).split()) in shown, f"`exgrpo {name} --help` hides the default of {action.option_strings}"


def test_train_on_a_comparison_file_names_the_arm_it_trains(capsys):
    from exgrpo.cli import _run_config

    cfg = _run_config(VLLM, {}, None)
    said = capsys.readouterr().err
    assert said == (f"{VLLM} is a comparison of grpo, exgrpo: training its arm grpo, seed 0 (another arm: --arm NAME; "
                    f"every arm and seed: exgrpo compare {VLLM})\n")
    assert cfg.name == "verl-tiny-vllm-grpo" and cfg.algorithm.replay.value == "none"

    cfg = _run_config(VLLM, {"seed": 3, "train.max_steps": 2}, "exgrpo")
    assert "training its arm exgrpo, seed 3" in capsys.readouterr().err
    # the arm's own overrides apply, as in `exgrpo compare`; --set goes to the base
    assert (cfg.name, cfg.seed, cfg.train.max_steps) == ("verl-tiny-vllm-exgrpo", 3, 2)
    assert cfg.algorithm.replay.value == "buckets" and cfg.algorithm.replay_start_pass_rate == 0.0


def test_a_bad_arm_is_one_line_listing_the_arms(capsys):
    assert main(["train", VLLM, "--arm", "ppo"]) == 2
    assert capsys.readouterr().err == (f"error: --arm ppo: {VLLM} has no such arm; its arms are grpo, exgrpo\n")
    with pytest.raises(ConfigError, match="is not a comparison file .* drop --arm"):
        from exgrpo.cli import _run_config

        _run_config("experiments/toy-exgrpo.yaml", {}, "grpo")


def test_train_runs_the_chosen_arm_of_a_comparison(tmp_path, capsys):
    """End to end on the toy tier, 2 steps: the run is the comparison's own (arm, seed) run."""
    assert main(["train", "experiments/toy.yaml", "--arm", "exgrpo-early", "--seed", "1", "--max-steps", "2",
                 "--no-tracking", "--no-progress", "--output-dir", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert "training its arm exgrpo-early, seed 1" in out.err
    record = json.loads(out.out)
    assert record["run_dir"] == str(tmp_path / "toy" / "toy-exgrpo-early" / "seed1")
    saved = json.loads((tmp_path / "toy" / "toy-exgrpo-early" / "seed1" / "config.json").read_text())
    assert saved["algorithm"]["replay"] == "buckets" and saved["algorithm"]["replay_start_pass_rate"] == 0.0


def test_building_the_parser_imports_no_torch():
    """`exgrpo --help` answers in a fraction of a second: building the parser imports no torch, Ray,
    MLflow or Prefect (each command imports what it runs)."""
    code = ("import sys, exgrpo.cli; exgrpo.cli.build_parser(); "
            "print(sorted(m for m in ('torch', 'ray', 'mlflow', 'prefect') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "[]\n"


def _trickling_server(stop: threading.Event) -> tuple[socket.socket, threading.Thread]:
    """A server that answers an HTTP request a byte every 0.2 s until ``stop``: a client's read timeout
    (the doctor's MLflow check: 3 s) restarts at each byte, so the check waits as long as the test wants."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            while not stop.wait(0.2):
                try:
                    conn.sendall(b"X")
                except OSError:  # the client is gone
                    return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server, thread


def test_ctrl_c_in_a_commands_first_second_ends_it_with_one_line():
    """SIGINT in `exgrpo doctor`'s first second, once it has printed its first check: exit 130 and
    "interrupted", no traceback. Its MLflow check reads a response that never ends, so the command is
    still running when the signal lands however late the signal is sent: a silent port let the check
    time out in 3 s and the doctor end on its own (exit 1) on a loaded machine."""
    code = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); import exgrpo.cli; "
            "print('started', flush=True); sys.exit(exgrpo.cli.main(sys.argv[1:]))")
    stop = threading.Event()
    server, thread = _trickling_server(stop)
    uri = f"http://127.0.0.1:{server.getsockname()[1]}"
    proc = subprocess.Popen([sys.executable, "-u", "-c", code, "doctor", "--tracking-uri", uri], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "started\n"
        # the doctor's first line: main is running, and its next check waits on the endless response
        assert proc.stdout.readline().startswith("ok ")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)  # a hang guard
    finally:
        proc.kill()
        proc.wait()
        stop.set()
        server.close()
        thread.join(timeout=5)
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "interrupted", err[-2000:]


def test_train_with_overrides_never_moves_a_comparisons_run_of_another_config_aside(tmp_path):
    """`exgrpo train <comparison> --set train.lr=...` resolves to the comparison's own (arm, seed)
    directory: where the comparison's run is there, made with another config, it is refused before
    any work (training would move that run aside, and `compare --resume` would no longer find it)."""
    from exgrpo.config import load_run

    where = {"output_dir": str(tmp_path)}
    cfg, _ = load_run("experiments/tiny-lm-chain.yaml", dict(where))
    cfg.run_dir().mkdir(parents=True)
    (cfg.run_dir() / "config.json").write_text(cfg.model_dump_json())  # the comparison's finished run
    with pytest.raises(ConfigError, match=r"holds the comparison's run of arm grpo, seed 0, made with another config "
                                          r"\(train.lr\); .*its own name \(--set name=NAME\)"):
        load_run("experiments/tiny-lm-chain.yaml", {**where, "train.lr": 1e-4})
    assert load_run("experiments/tiny-lm-chain.yaml", {**where, "train.max_steps": 300})[0].run_dir() == cfg.run_dir()
    other, _ = load_run("experiments/tiny-lm-chain.yaml", {**where, "train.lr": 1e-4, "name": "chain-lr"})
    assert other.run_dir() != cfg.run_dir()  # a name of its own: allowed
    assert main(["train", "experiments/tiny-lm-chain.yaml", "--set", "train.lr=1e-4", "--output-dir", str(tmp_path),
                 "--no-tracking"]) == 2


_DROPPED_STOP = """
import os, signal, sys, time, weakref
from exgrpo.cli.signals import Terminated, disarm, install_stop_handlers, stop_signal_of
signal.signal(signal.SIGINT, signal.default_int_handler)  # pytest-xdist's workers ignore SIGINT, and so would this
install_stop_handlers()
handler, mode = sys.argv[1:3]
sig = signal.SIGINT if handler == "ctrl-c" else signal.SIGTERM
if handler == "prefect":  # as Prefect's flow engine sets it while a flow runs
    from prefect.exceptions import TerminationSignal
    def _prefect(signum, frame):
        raise TerminationSignal(signal=signum)
    signal.signal(signal.SIGTERM, _prefect)
if mode == "returned":  # the command has returned: atexit callbacks run to their end
    disarm()

class Held:
    pass

def collected(_ref):  # a weak reference's callback: Python prints what it raises and drops it
    os.kill(os.getpid(), sig)
    for _ in range(100_000):  # the handler runs here, between two bytecodes of this callback
        pass

held = Held()
ref = weakref.ref(held, collected)
try:
    del held
    if mode == "stopping":  # the signal delivered again, at once, and raised where it should be
        raise Terminated()
    deadline = time.monotonic() + (3 if mode == "returned" else 60)
    while time.monotonic() < deadline:
        pass
except BaseException as e:
    print("stopped by", stop_signal_of(e), flush=True)
    try:
        time.sleep(0.5)  # the command's cleanup
    except BaseException:
        print("cleanup interrupted", flush=True)
        raise
    sys.exit(143)
print("never stopped", flush=True)
"""


@pytest.mark.parametrize(("handler", "mode"), [("cli", "running"), ("prefect", "running"), ("ctrl-c", "running"),
                                               ("cli", "stopping"), ("cli", "returned")])
def test_a_stop_signal_whose_exception_python_dropped_in_a_callback_is_sent_again(handler, mode):
    """A SIGTERM (or Ctrl-C) whose handler raises inside a weak reference's callback, as a garbage collection
    runs one: Python drops that exception. While the command runs the signal is sent again, and the command
    stops at its next bytecode; not while the command is already stopping (its cleanup is not interrupted),
    nor once it has returned."""
    proc = subprocess.run([sys.executable, "-c", _DROPPED_STOP, handler, mode], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)  # a hang guard
    said = proc.stdout + proc.stderr[-2000:]
    if mode == "returned":
        assert proc.stdout == "never stopped\n" and "Exception ignored" in proc.stderr, said
        return
    expected = signal.SIGINT if handler == "ctrl-c" else signal.SIGTERM
    assert proc.stdout == f"stopped by {int(expected)}\n", said
    assert proc.returncode == 143 and "Exception ignored" not in proc.stderr, said
