"""One formatter for every one-line error the project reports (exgrpo.errors.one_line)."""

from exgrpo.cluster import ClusterError
from exgrpo.config import ConfigError
from exgrpo.errors import UserError, one_line
from exgrpo.tracking import TrackingError


def test_an_error_is_its_type_and_its_message_on_one_line():
    assert one_line(KeyError("address")) == "KeyError: 'address'"
    assert one_line(RuntimeError("cannot start:\n  port taken\nretry later")) == \
        "RuntimeError: cannot start: port taken; retry later"
    assert one_line(ValueError()) == "ValueError"


def test_an_error_phrased_for_the_user_is_its_message_alone():
    for cls in (ConfigError, ClusterError, TrackingError):
        assert issubclass(cls, UserError)
        assert one_line(cls("train.lr: use a number")) == "train.lr: use a number"


def test_a_long_line_is_cut_where_asked_and_kept_whole_with_no_limit():
    long = RuntimeError("word " * 200)
    assert len(one_line(long)) == 300 and one_line(long).endswith("…")
    assert len(one_line(long, 40)) == 40
    assert one_line(long, None) == "RuntimeError: " + ("word " * 200).strip()


def test_a_ray_tasks_error_is_told_by_the_exception_that_ended_the_task():
    """What ``ray.get`` raises for a failed task (Ray's own class, built as Ray builds it) prints the
    remote traceback; the line is its cause's."""
    from ray.exceptions import RayTaskError

    cause = ValueError("bucket_lbound=2 must be < bucket_rbound=2")
    raised = RayTaskError("run_trial", "Traceback (most recent call last):\n  File ...\nValueError: ...", cause)
    raised = raised.as_instanceof_cause()
    assert "  File ..." in str(raised) and isinstance(raised, ValueError)  # its message: the traceback
    assert one_line(raised) == "ValueError: bucket_lbound=2 must be < bucket_rbound=2"
