"""Entry point of a veRL run: ``python -m exgrpo.backends.verl.main <run_dir>/config.json [overrides]``.

Loads our typed config, derives veRL's Hydra config from it (:mod:`.overrides`), and runs veRL's
``run_ppo`` with :class:`ExGRPOTaskRunner`, which builds :class:`ExGRPORayTrainer` instead of veRL's
``RayPPOTrainer``. The Prefect flow submits exactly this command as a Ray Job.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import ray

from exgrpo.backends.verl.prepared import JOB_ERROR
from exgrpo.config import ExperimentConfig
from exgrpo.backends.verl import resources
from exgrpo.backends.verl.live import LiveMetrics
from exgrpo.backends.verl.overrides import compose
from exgrpo.cluster import ClusterError, alive_nodes, describe, join
from exgrpo.lean_imports import RAY_SETUP_HOOK
from exgrpo.raylocal import LOCAL_SYSTEM_CONFIG, agent_port_any, enable_token_auth


FORWARDED_ENV = ("VERL_PLATFORM", "VERL_ENGINE_DEVICE", "EXGRPO_SEED", "PYTHONPATH", "VERL_FILE_LOGGER_PATH",
                 "EXGRPO_BIND_LOOPBACK", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND",
                 "EXGRPO_FAULT_HOLD_AFTER_CHECKPOINT")
"""Variables passed on to veRL's Ray workers (with every ``MLFLOW_*``: the run and store to report to)."""

JOB_RAY_SYSTEM_CONFIG = {**LOCAL_SYSTEM_CONFIG, "prestart_worker_first_driver": False}
"""The job's private Ray starts no idle workers ahead of work (Ray starts one per CPU by default): veRL
gives each of its actors a runtime environment of its own, so no actor would ever run in them, and each
costs an interpreter start (about 1.5 s of CPU)."""

LAUNCHER_ENV = "EXGRPO_LAUNCHER_PID"
"""PID of the command that started this job as its child process (unset for a Ray Job)."""

class ExGRPOTaskRunner:
    """veRL's v0 TaskRunner, building :class:`ExGRPORayTrainer` (veRL's own is a Ray actor class
    and cannot be subclassed). On a cluster it runs as a Ray actor (:data:`RemoteTaskRunner`), as
    veRL's does; on the job's private local Ray it runs in the job's own process, which has veRL
    imported already: one interpreter fewer to start and import veRL into (about 8 s of CPU)."""

    def run(self, config, exgrpo_json: str) -> None:
        from omegaconf import OmegaConf
        from verl.trainer.main_ppo_v0 import BaseTaskRunner
        from verl.trainer.ppo.utils import create_rl_dataset, need_critic, need_reference_policy
        from verl.utils.config import omega_conf_to_dataclass, validate_config
        from verl.utils.dataset.rl_dataset import collate_fn
        from verl.workers.config import HFModelConfig

        # veRL: imported when the job runs, not when the module is read
        from exgrpo.backends.verl.trainer import ExGRPORayTrainer

        cfg = ExperimentConfig.model_validate_json(exgrpo_json)
        OmegaConf.resolve(config)
        base = BaseTaskRunner()
        _, worker_group_cls = base.add_actor_rollout_worker(config)
        base.add_critic_worker(config)
        base.add_reward_model_resource_pool(config)
        validate_config(config=config, use_reference_policy=need_reference_policy(config),
                        use_critic=need_critic(config))
        model_config: HFModelConfig = omega_conf_to_dataclass(config.actor_rollout_ref.model)
        tokenizer, processor = model_config.tokenizer, model_config.processor
        resource_pool_manager = base.init_resource_pool_mgr(config)
        train = create_rl_dataset(config.data.train_files, config.data, tokenizer, processor, is_train=True)
        val = create_rl_dataset(config.data.val_files, config.data, tokenizer, processor, is_train=False)
        trainer = ExGRPORayTrainer(
            config=config, tokenizer=tokenizer, processor=processor, role_worker_mapping=base.role_worker_mapping,
            resource_pool_manager=resource_pool_manager, ray_worker_group_cls=worker_group_cls,
            train_dataset=train, val_dataset=val, collate_fn=collate_fn, exgrpo_cfg=cfg,
        )

        live = LiveMetrics.from_env()  # the MLflow run the caller created, if any: steps go there live
        if live is not None:
            live.start()
        try:
            ended = trainer.ended_at()
            if ended is not None:  # a finished run resumed (e.g. by `exgrpo compare --resume`): nothing to train
                print(f"exgrpo: the run already ended at step {ended} of {trainer.total_training_steps}; "
                      "nothing to train", flush=True)
            else:
                trainer.init_workers()
                trainer.fit()
                trainer.prune_checkpoints()  # the last step's row is written: the step before it may go
        finally:
            if live is not None and not live.stop():
                print("exgrpo live metrics: MLflow did not take every step; metrics.jsonl has them all "
                      "(the caller backfills what is missing)", flush=True)


RemoteTaskRunner = ray.remote(num_cpus=1)(ExGRPOTaskRunner)


def run(cfg: ExperimentConfig, overrides: list[str]) -> None:
    """Compose veRL's config and train (in this process, as Ray's driver)."""
    from omegaconf import OmegaConf
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    config = compose(overrides)
    private = False
    if not ray.is_initialized():
        init = OmegaConf.to_container(config.ray_kwargs.get("ray_init", {}), resolve=True)
        runtime_env = OmegaConf.to_container(OmegaConf.merge(get_ppo_ray_runtime_env(config), init.pop("runtime_env", {}) or {}))
        # each Ray worker loads veRL, and with it transformers, without scikit-learn (exgrpo/lean_imports.py)
        runtime_env.setdefault("worker_process_setup_hook", RAY_SETUP_HOOK)
        env = runtime_env.setdefault("env_vars", {})
        for key, value in os.environ.items():  # what the TaskRunner needs, also on a configured cluster
            if key in FORWARDED_ENV or key.startswith("MLFLOW_"):
                env[key] = value
        init = {k: v for k, v in init.items() if v is not None}
        if init.get("address") == "local":  # a private Ray, even inside a Ray Job (its env is forwarded above)
            os.environ.pop("RAY_JOB_CONFIG_JSON_ENV_VAR", None)
            os.environ.pop("RAY_ADDRESS", None)
            env.update(enable_token_auth())
            init["_system_config"] = JOB_RAY_SYSTEM_CONFIG
            agent_port_any()
            ray.init(runtime_env=runtime_env, **init)
            private = True
        else:
            join(init.pop("address"), runtime_env=runtime_env, **init)
            print(f"exgrpo: veRL job on {describe(cfg.backend.verl.ray_address)}", flush=True)
            resources.check(cfg.backend.verl, alive_nodes(), cfg.backend.verl.ray_address or "")
    if private:
        ExGRPOTaskRunner().run(config, cfg.model_dump_json())
    else:
        from exgrpo.backends.verl.resources import DRIVER_NODE_ENV

        runner = RemoteTaskRunner
        if os.environ.get(DRIVER_NODE_ENV):  # beside the launching task, off the CPUs the workers' bundles need
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            runner = runner.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
                os.environ[DRIVER_NODE_ENV], soft=True))
        ray.get(runner.remote().run.remote(config, cfg.model_dump_json()))


def stop_with_launcher(poll_seconds: float = 1.0, grace_seconds: float = 60.0) -> None:
    """When the command that launched this job dies (``kill -9`` of ``exgrpo train``, or a SIGTERM it
    had no time to pass on), the job SIGTERMs itself: Ray's handler then shuts the private cluster
    down, and nothing of the run outlives the command by more than a few seconds. Without this the
    orphaned job trained on, re-parented to init, with its whole Ray. If the shutdown has not ended the
    process after ``grace_seconds``, it exits at once."""
    import signal
    import threading
    import time

    launcher = os.environ.pop(LAUNCHER_ENV, None)  # not for the processes this job starts
    if not launcher:
        return
    if os.getppid() != int(launcher):  # started through a wrapper (a shell script, `conda run`...)
        print("exgrpo: the job's parent is not the command that launched it; it will not stop with that command",
              flush=True)
        return

    def watch() -> None:
        while os.getppid() == int(launcher):
            time.sleep(poll_seconds)
        os.kill(os.getpid(), signal.SIGTERM)  # (no message: the launcher was the reader of this output)
        time.sleep(grace_seconds)  # Ray's shutdown hung
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="launcher-watch").start()


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    stop_with_launcher()
    if not argv:
        raise SystemExit("usage: python -m exgrpo.backends.verl.main <run_dir>/verl_run.json")
    spec = json.loads(Path(argv[0]).read_text())
    cfg = ExperimentConfig.model_validate_json(json.dumps(spec["config"]))

    try:
        run(cfg, list(spec["overrides"]) + argv[1:])
    except ClusterError as e:  # diagnosed here: one line for the caller (prepared.JOB_ERROR), no traceback
        print(f"{JOB_ERROR}{e}", flush=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
