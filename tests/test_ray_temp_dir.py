"""The private local Ray's temp dir (`exgrpo-ray-*`) is removed at the exit of the process that started
it, after its Ray is shut down: only its own, and no Ray is started here."""

from __future__ import annotations

import os

import pytest

from exgrpo import raylocal


def test_the_temp_dirs_of_the_rays_this_process_started_are_removed_after_shutdown(tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.setattr(raylocal, "_STARTED", [])
    monkeypatch.setattr(raylocal, "enable_token_auth", lambda: {})
    monkeypatch.setattr(raylocal, "agent_port_any", lambda: None)
    registered, started = [], []
    monkeypatch.setattr(raylocal.atexit, "register", lambda fn, **kw: registered.append((fn, kw)))

    def init(**kw):  # a Ray that writes its session into the temp dir it is given
        session = os.path.join(kw["_temp_dir"], "session_1", "logs")
        os.makedirs(session)
        open(os.path.join(session, "raylet.out"), "w").close()
        started.append(kw["_temp_dir"])

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "is_initialized", lambda: bool(started))
    def shutdown():  # what each session dir is when Ray shuts down: still there, its processes may still write
        started.append(("shutdown", [os.path.isdir(d) for d in started[:2]]))

    monkeypatch.setattr(ray, "shutdown", shutdown)
    raylocal.init_local_ray(1)
    raylocal.init_local_ray(1)  # a second private Ray in the same process (e.g. one with a job server)
    ours = started[:2]
    other = tmp_path / "exgrpo-ray-someone-else"
    other.mkdir()
    assert all(os.path.basename(d).startswith("exgrpo-ray-") and os.path.dirname(d) == str(tmp_path) for d in ours)
    (handler, kwargs), = registered  # one exit handler, registered after `import ray`: it runs before Ray's own
    handler(**{**kwargs, "pid": os.getpid() + 1})  # in a forked child: its parent's to remove
    assert all(os.path.isdir(d) for d in ours)
    handler(**kwargs)
    assert started[2:] == [("shutdown", [True, True])]  # shut down first, while both dirs were there
    assert not any(os.path.exists(d) for d in ours) and other.is_dir()  # then removed, only this process's
