"""The ``verl`` backend: prepare a run (model, data, veRL overrides), launch it, collect its metrics.

:func:`prepare` writes ``<run_dir>/verl_run.json`` (our config + the derived Hydra overrides) and
returns the command and environment that run it; the CLI runs that command as a child process, the
Prefect flow submits the same command as a Ray Job. :func:`collect` turns veRL's metric log into
our ``metrics.jsonl`` (METRICS.md names: ``val/accuracy`` among them).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exgrpo.atomic import torch_save_atomic, write_text_atomic
from exgrpo.backends.base import HFCheckpoint, MLflowRun, TrainResult
from exgrpo.backends.verl.jobs import local_job_server, run_ray_job
from exgrpo.backends.verl.live import FILE_LOGGER_ENV, LOOPBACK_ENV, RUN_ID_ENV, StepFeed, TRACKING_URI_ENV, verl_row
from exgrpo.backends.verl.prepared import (DIAGNOSIS_LINES, SPEC_FILE, PreparedRun, VerlRunError, diagnosed, fatal_line,
                                           last_error, stalled)
from exgrpo.config import ConfigError, ExperimentConfig
from exgrpo.config.backend import VerlSettings, verl_model
from exgrpo.progress import StepProgress, console, is_watched
from exgrpo.raylocal import local_temp_dir
from exgrpo.backends.verl import assets
from exgrpo.backends.verl.checkpoints import newest_intact
from exgrpo.backends.verl.overrides import RunPaths, hydra_overrides
from exgrpo.runs import NothingToResume, check_resume, refuse_earlier_run

OWN_LINE = re.compile(r"^(?:\x1b\[[0-9;]*m)?(?:\([^)]*\)\s*)?(?:\x1b\[[0-9;]*m)?\s*(exgrpo: .*)$")
"""The job's own lines for the user (a resume, where it runs), shown above the step bar: ``exgrpo: ...``,
printed by the driver or by one of its Ray actors (whose lines Ray prefixes with ``(Actor pid=N)``)."""


def own_line(line: str) -> str | None:
    """The ``exgrpo: ...`` message of one of the job's output lines, if it is one."""
    match = OWN_LINE.match(line.rstrip())
    return match.group(1) if match else None
RAW_METRICS = "verl_metrics"
"""Directory of veRL's own metric logs, one JSONL file per attempt (veRL truncates its file on open)."""
DATASETS_CACHE = "hf-datasets-cache"
"""The run's Hugging Face datasets cache in its run directory while its job runs (``HF_DATASETS_CACHE``)."""


def check_resumable(cfg: ExperimentConfig, force_resume: bool = False) -> None:
    """Raise what a resume of ``cfg`` is refused with: no veRL run in its directory, or one made with a
    config that differs in what the run means (unless ``force_resume``)."""
    spec = cfg.run_dir().resolve() / SPEC_FILE
    if not spec.is_file():
        raise NothingToResume(f"--resume: {spec.parent} holds no veRL run; run without --resume")
    check_resume(json.loads(spec.read_text())["config"], cfg.model_dump_json(), spec, force=force_resume)


def prepare(cfg: ExperimentConfig, resume: bool = False, progress: bool = False,
            force_resume: bool = False) -> PreparedRun:
    """Build the run's assets and its veRL overrides; nothing is launched."""
    python = job_python(cfg.backend.verl)  # before any work: a missing job environment is a one-line error
    assets.check_model_context(cfg)  # before any work too: a model too short for the lengths asked for
    run_dir = cfg.run_dir().resolve()
    ckpt = run_dir / "checkpoints"
    if resume:
        check_resumable(cfg, force_resume)
    else:
        refuse_earlier_run(run_dir)  # a fresh run never mixes with an earlier run's checkpoints
    run_dir.mkdir(parents=True, exist_ok=True)
    v = cfg.backend.verl
    model = assets.model_dir(cfg, progress=progress)
    if v.train_files:
        train_files, val_files = v.train_files, v.val_files or v.train_files
    else:
        train, val = assets.write_dataset(cfg, run_dir / "data", model)
        train_files, val_files = str(train), str(val)
    reward_fn = Path(__file__).with_name("reward.py")
    paths = RunPaths(model, train_files, val_files, ckpt, reward_fn)
    overrides = hydra_overrides(cfg, paths)
    scratch = [run_dir / DATASETS_CACHE]
    if cfg.backend.verl.device == "cpu" and cfg.backend.verl.ray_address is None:
        ray_tmp = local_temp_dir()  # under RAY_TMPDIR, and short: Ray's socket paths must fit 107 chars
        scratch.append(Path(ray_tmp))
        overrides += [f"+ray_kwargs.ray_init._temp_dir={ray_tmp}"]
    try:
        spec = {"config": json.loads(cfg.model_dump_json()), "overrides": overrides,
                "external_model": model if verl_model(cfg) is not None else None}
        write_text_atomic(run_dir / SPEC_FILE, json.dumps(spec, indent=1))
        raw = run_dir / RAW_METRICS
        raw.mkdir(exist_ok=True)
        attempt = len(list(raw.glob("attempt_*.jsonl")))
        env = job_env(cfg, raw / f"attempt_{attempt:03d}.jsonl")
    except BaseException:
        remove_scratch(scratch)
        raise
    # veRL reads the run's parquet files through `datasets`, which keeps an Arrow copy of each in its
    # cache: the run's own, removed with it, instead of two entries per run in the user's home
    env["HF_DATASETS_CACHE"] = str(run_dir / DATASETS_CACHE)
    command = [python, "-m", "exgrpo.backends.verl.main", str(run_dir / SPEC_FILE),
               "trainer.logger=[console,file]"]
    return PreparedRun(run_dir, command, env, scratch)


def remove_scratch(dirs: list[Path]) -> None:
    """Remove the directories a run made for itself (:attr:`PreparedRun.scratch`) once its job has ended."""
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def job_env(cfg: ExperimentConfig, metrics_file: Path) -> dict[str, str]:
    """The variables a veRL job of ``cfg`` runs with on top of the caller's environment: the platform, its
    step-metrics file, the loopback binding of a private Ray, vLLM's CPU settings on cpu."""
    v = cfg.backend.verl
    env = {
        "VERL_PLATFORM": "cpu" if v.device == "cpu" else "",
        "VERL_ENGINE_DEVICE": "cuda",
        FILE_LOGGER_ENV: str(metrics_file),
        "EXGRPO_SEED": str(cfg.seed),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "RAY_DEDUP_LOGS": "0",
        "PYTHONUNBUFFERED": "1",  # the driver's lines (and the steps they announce) arrive as they are printed
    }
    if v.ray_address is None:  # a private local Ray: its rollout servers bind 127.0.0.1
        env[LOOPBACK_ENV] = "1"
    if v.ray_address is not None and "ray" in sys.modules:  # launched by a comparison's or sweep's Ray task
        import ray

        from exgrpo.backends.verl.resources import DRIVER_NODE_ENV

        if ray.is_initialized():  # its TaskRunner goes beside it, where the plan left room (resources.plan_slots)
            env[DRIVER_NODE_ENV] = ray.get_runtime_context().get_node_id()
    if v.rollout == "vllm" and v.device == "cpu":
        env.update({"VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache: plenty for these models
                    "VLLM_CPU_OMP_THREADS_BIND": "nobind"})  # "auto" pins one core and reserves the rest
    return {k: val for k, val in env.items() if val}


def ended_at(run_dir: Path, max_steps: int | None) -> int | None:
    """The step a run already ended at: its newest intact checkpoint, if at or past ``max_steps``
    (a run bounded by epochs is left to the job, which knows its length)."""
    step = newest_intact(run_dir / "checkpoints", run_dir / RAW_METRICS) if max_steps else None
    return step if step is not None and step >= max_steps else None


def job_python(v: VerlSettings) -> str:
    """The interpreter the job runs in: ``backend.verl.python`` (checked to exist), or this one."""
    if v.python is None:
        return sys.executable
    path = Path(v.python).expanduser()
    path = path if path.is_absolute() else Path.cwd() / path  # not resolved: a venv's python is a symlink
    if not os.access(path, os.X_OK) or path.is_dir():
        made_by = {".venv-job": "make job-env", ".venv-gpu": "make gpu-env"}
        hint = next((f" (build it with `{make}`)" for venv, make in made_by.items() if venv in str(v.python)), "")
        raise ConfigError(f"backend.verl.python={v.python}: no interpreter at {path}{hint}")
    return str(path)


def collect(run_dir: Path) -> list[dict[str, float]]:
    """veRL's metric logs of every attempt -> our rows (one per step; a resumed attempt's rows win)."""
    by_step: dict[int, dict[str, float]] = {}
    for path in sorted((run_dir / RAW_METRICS).glob("attempt_*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                step, row = verl_row(json.loads(line))
            except json.JSONDecodeError:  # a torn last line of a killed attempt
                continue
            by_step.setdefault(step, {}).update(row)
    rows = [by_step[s] for s in sorted(by_step)]
    write_text_atomic(run_dir / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    return rows


def run_local(prepared: PreparedRun, progress: bool = True, log_tail: int = 40, feed: StepFeed | None = None,
              poll_seconds: float = 1.0, stall_seconds: float | None = None,
              notify: Callable[[str], None] | None = None) -> None:
    """Run the prepared command as a child process; its output goes to ``verl.log`` (and the
    terminal with ``progress``). A failure raises :class:`VerlRunError` with the log's last lines.
    ``feed`` is polled as the job prints (at most every ``poll_seconds``); when one of its callbacks
    raises, the job is stopped (SIGTERM, then SIGKILL after 30 s) and this raises VerlRunError. A job
    that prints nothing for ``stall_seconds`` (a hung worker or rollout server) is stopped and fails, as
    is one whose log says it cannot finish (:func:`~exgrpo.backends.verl.prepared.fatal_line`).
    Without ``progress``, the job's own ``exgrpo: `` lines (a resume, where it runs) go to ``notify``."""
    import queue
    import threading

    from exgrpo.backends.verl.main import LAUNCHER_ENV  # Ray: the job's entry point imports it at the top

    env = {**os.environ, **prepared.env, LAUNCHER_ENV: str(os.getpid())}  # the job stops if this process dies
    log_path = prepared.run_dir / "verl.log"
    tail: deque[str] = deque(maxlen=log_tail)
    recent: deque[str] = deque(maxlen=DIAGNOSIS_LINES)  # what the error line is read from
    last_poll = time.monotonic()
    stopped: str | None = None  # why this process stopped the job (a stall, a fatal line of its log)
    # a process group of its own: a terminal's Ctrl-C reaches this process alone, which stops the job as it
    # stops it on SIGTERM (one path, bounded), and the group holds what the job starts (Ray's processes)
    proc = subprocess.Popen(prepared.command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, start_new_session=True)
    assert proc.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()

    def read(stream=proc.stdout) -> None:  # owns the stream: closed here, never under its feet
        with stream:
            for text in stream:
                lines.put(text)
        lines.put(None)

    threading.Thread(target=read, daemon=True, name="verl-output").start()
    try:
        with log_path.open("a") as log:
            while True:
                try:
                    line = lines.get(timeout=stall_seconds)
                except queue.Empty:
                    stopped = stalled(stall_seconds)
                    stop_child(proc)
                    break
                if line is None:
                    break
                log.write(line)
                tail.append(line.rstrip())
                recent.append(line.rstrip())
                if progress:
                    print(line, end="", flush=True)
                elif notify is not None and (message := own_line(line)):
                    notify(message)
                if fatal := fatal_line(line):
                    stopped = fatal
                    stop_child(proc)
                    break
                if feed is not None and time.monotonic() - last_poll >= poll_seconds:
                    last_poll = time.monotonic()
                    if not feed.poll():
                        stop_child(proc)
                        break  # processes the job started may hold its output open: do not wait for the end
        rc = proc.wait()
    except BaseException:  # Ctrl-C, SIGTERM (the CLI's Terminated), a callback's error: the job stops too
        stop_child(proc)
        raise
    if stopped:
        raise VerlRunError(f"veRL run {stopped}; {last_error(recent)}see {log_path}. Last lines:\n" + "\n".join(tail))
    if rc != 0:
        raise VerlRunError(diagnosed(tail) or f"veRL run failed (exit code {rc}): {last_error(recent)}see {log_path}. "
                           "Last lines:\n" + "\n".join(tail))


STOP_GRACE_SECONDS = 30.0
"""How long a stopped job may take to shut its private Ray down before its process group is killed."""


def stop_child(proc: subprocess.Popen, grace_seconds: float = STOP_GRACE_SECONDS) -> None:
    """Stop a job started by :func:`run_local`: SIGTERM its driver (Ray's handler shuts the private
    cluster down), then SIGKILL its process group, at once if the driver lingers past ``grace_seconds``
    or a second interrupt arrives meanwhile, else whatever of the group outlived it."""
    try:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(grace_seconds)
    except subprocess.TimeoutExpired:
        pass
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)


def _launch(prepared: PreparedRun, v: VerlSettings, feed: StepFeed, echo: bool, mlflow_run: MLflowRun | None,
            notify: Callable[[str], None] | None = None) -> None:
    """Run the job (a child process, or a Ray Job) to its end, feeding each step to ``feed``; ``echo``
    prints its output as it comes, else ``notify`` gets the job's own ``exgrpo: `` lines. A callback's
    exception (e.g. a pruned trial) is raised as is."""
    try:
        if v.launch == "ray_job":
            def submitted(job_id: str) -> None:
                if mlflow_run is not None:
                    import mlflow

                    mlflow.MlflowClient(mlflow_run.tracking_uri).set_tag(mlflow_run.run_id, "ray_job_id", job_id)

            def own(line: str) -> None:
                if notify is not None and (message := own_line(line)):
                    notify(message)

            run_ray_job(prepared, v.job_address or local_job_server(), on_line=print if echo else own,
                        on_submit=submitted, feed=feed, stall_seconds=v.stall_timeout_s)
        else:
            run_local(prepared, progress=echo, feed=feed, stall_seconds=v.stall_timeout_s, notify=notify)
    except VerlRunError:
        if feed.error is not None:  # a callback stopped the job (e.g. pruned): that is the outcome
            raise feed.error from None
        raise
    feed.poll()  # the steps written after the runner's last poll
    if feed.error is not None:
        raise feed.error


class StepLines:
    """A plain line per step of a veRL job (where no person watches a bar): the step, batch pass@1,
    the pool, and the validation accuracy at evaluation steps."""

    def __init__(self, total: int | None) -> None:
        self.total = total

    def __call__(self, step: int, m: dict[str, float]) -> None:
        parts = [f"step {step}" + (f"/{self.total}" if self.total else ""), f"batch pass@1 {m.get('batch/solved', 0):.3f}"]
        if "pool/questions" in m:
            parts.append(f"pool {int(m['pool/questions'])}")
        if "val/accuracy" in m:
            parts.append(f"val acc {m['val/accuracy']:.4f}")
        print("  ".join(parts), flush=True)


class VerlBackend:
    """veRL's RayPPOTrainer with the ExGRPO replay core (CPU here, GPU on a cluster)."""

    name = "verl"
    reports_to_mlflow = True
    """Given an MLflow run, the job logs every step to it live (:mod:`exgrpo.backends.verl.live`)."""

    def train(self, cfg: ExperimentConfig, callbacks=None, resume: bool = False, progress: bool = True,
              force_resume: bool = False, mlflow_run: MLflowRun | None = None):
        prepared = prepare(cfg, resume=resume, progress=progress, force_resume=force_resume)
        try:
            return self._run(prepared, cfg, callbacks, resume, progress, mlflow_run)
        finally:  # ended, failed or stopped: the job and its private Ray are gone
            remove_scratch(prepared.scratch)

    def _run(self, prepared: PreparedRun, cfg: ExperimentConfig, callbacks, resume: bool, progress: bool,
             mlflow_run: MLflowRun | None):
        ended = ended_at(prepared.run_dir, cfg.train.max_steps) if resume else None
        if ended is not None:  # a finished run resumed (e.g. by `exgrpo compare --resume`): reused as it is
            note = f"exgrpo: the run already ended at step {ended} of {cfg.train.max_steps}; nothing to train"
            with (prepared.run_dir / "verl.log").open("a") as log:
                log.write(note + "\n")
            if progress:
                print(note, flush=True)
            return self._result(prepared.run_dir)
        if mlflow_run is not None:
            prepared.env.update({TRACKING_URI_ENV: mlflow_run.tracking_uri, RUN_ID_ENV: mlflow_run.run_id})
        v = cfg.backend.verl
        # veRL's own output (a line of ~100 metrics per step, its workers' logs) goes to verl.log only; a
        # terminal gets a step bar, logs, pipes and a Prefect flow run's log a plain line per step; both
        # get the job's own lines (a resume, where it runs). EXGRPO_VERL_ECHO=1 echoes everything.
        bar = StepProgress(cfg.train.max_steps, enabled=progress and is_watched(), title=cfg.name)
        echo = progress and os.environ.get("EXGRPO_VERL_ECHO") == "1"
        plain = progress and not bar.enabled and not echo
        shown = [bar.show] if bar.enabled else [StepLines(cfg.train.max_steps)] if plain else []
        # the callbacks see each step while the job runs (live progress, a sweep's pruning), as on the native backend
        feed = StepFeed(prepared.env[FILE_LOGGER_ENV], [*(callbacks or []), *shown])
        if bar.enabled:
            where = f"the Ray cluster at {v.ray_address}" if v.ray_address else "a private local Ray"
            console.print(f"veRL ({v.launch}) on {where}: {prepared.run_dir}; its output: {prepared.run_dir / 'verl.log'}",
                          soft_wrap=True)  # unwrapped: the paths stay whole for copy and paste
        def notify(line: str) -> None:  # above the bar, or as a plain line
            if bar.enabled:
                console.print(line, soft_wrap=True, markup=False, highlight=False)
            else:
                print(line, flush=True)

        with bar:
            try:
                _launch(prepared, v, feed, echo, mlflow_run, notify if progress else None)
            except BaseException:
                with contextlib.suppress(Exception):  # never in place of the run's own error
                    collect(prepared.run_dir)  # a failed or stopped run keeps the steps it trained, as a native run does
                raise
        return self._result(prepared.run_dir)

    def check_resumable(self, cfg: ExperimentConfig, force_resume: bool = False) -> None:
        """What :meth:`train` with ``resume`` would refuse, raised before the job is prepared (:func:`check_resumable`)."""
        check_resumable(cfg, force_resume)

    def read_checkpoint(self, path: Path) -> dict[str, Any] | None:
        """A ``global_step_N/`` directory: its FSDP actor shards merged (:mod:`.actor_weights`)."""
        from exgrpo.backends.verl import actor_weights  # torch: not imported with the backend (`exgrpo doctor` reads it)

        return actor_weights.policy_state(path) if actor_weights.is_step_dir(path) else None

    def policy_file(self, checkpoint: Path) -> Path | None:
        """The shards of ``global_step_N/`` merged once into ``verl_global_step_N.pt`` beside it (an
        external model's into its HF directory, :func:`.hf_export.export`)."""
        from exgrpo.backends.verl import actor_weights, hf_export  # torch: not imported with the backend

        if not actor_weights.is_step_dir(checkpoint):
            return None
        if hf_export.external_model(checkpoint):  # an HF model exgrpo does not rebuild: its HF directory
            return hf_export.export(checkpoint)
        out = checkpoint.parent / f"verl_{checkpoint.name}.pt"
        if not out.is_file():
            torch_save_atomic(actor_weights.policy_state(checkpoint), out)
        return out

    def hf_checkpoint(self, path: Path) -> HFCheckpoint | None:
        """A checkpoint of an external model's run, or its merged directory (:mod:`.hf_export`)."""
        from exgrpo.backends.verl import hf_export

        return hf_export.hf_checkpoint(path)

    def build_policy(self, cfg: ExperimentConfig) -> tuple[Any, Any]:
        """The native LM policy: a veRL run's HF actor is its ``model``."""
        from exgrpo.policies.build import build_task_and_policy  # torch: as above

        return build_task_and_policy(cfg)

    @staticmethod
    def _result(run_dir: Path):
        """The finished run in ``run_dir``: its metrics (collected into metrics.jsonl) and newest checkpoint."""
        history = collect(run_dir)
        if not any("batch/solved" in r for r in history):
            raise VerlRunError(f"veRL run in {run_dir} finished but logged no training step")
        final = dict(history[-1])
        last_val = [r for r in history if "val/accuracy" in r]
        if last_val and "val/accuracy" not in final:
            final["val/accuracy"] = last_val[-1]["val/accuracy"]
        ckpts = sorted((run_dir / "checkpoints").glob("global_step_*"), key=lambda p: int(p.name.split("_")[-1]))
        return TrainResult(final, history, run_dir, ckpts[-1] if ckpts else None)


VERL = VerlBackend()
