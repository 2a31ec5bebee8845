"""Running `exgrpo` as a person does, for tests that signal it."""

WITH_CTRL_C = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); import exgrpo.cli; "
               "sys.exit(exgrpo.cli.main(sys.argv[1:]))")
"""`python -c WITH_CTRL_C <args>`: `exgrpo <args>` with Ctrl-C acting, as in a terminal. A process started
with SIGINT ignored (inherited by a test worker's children in CI, or by every process of a suite started as
a shell's background job) keeps it ignored, and a Ctrl-C test would wait on a command that never sees it."""
