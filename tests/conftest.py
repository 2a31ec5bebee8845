import os

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_sessionfinish(session, exitstatus):
    """Shut down the in-process Ray client that compare/sweep tests start, while the interpreter is
    whole: left to Ray's own atexit hook it runs during interpreter finalization, where one CI run's
    pytest process died with ``std::bad_alloc`` from Ray's C++ logger after every test had passed."""
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
