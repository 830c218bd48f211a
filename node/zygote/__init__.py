"""A fork server for Python services (issue 41: the CPU a test run spends starting processes).

Every node, gateway, agent or verifier a test or a devnet starts is `python -m MODULE ...`, and
each fresh interpreter pays 1.5-2 CPU-s importing torch, aiohttp, web3 and Planet's own modules
before it does anything. A zygote imports them once and forks a child per request:

    caller (node.procs.spawn_process)            zygote (python -m node.zygote SOCKET)
      │ request: argv, env, cwd, log fd ──────▶  checks it can stand in for a fresh
      │                                          interpreter (below), forks
      │ ◀── {"pid": N}                           child: setsid, fds, env, cwd, argv in
      │                                          /proc/N/cmdline, runs MODULE as __main__
      │ ◀── {"exit": returncode}                 reaps it, reports its status like Popen

The child is a real OS process, a session leader, whose `/proc/PID/cmdline` holds its own argv
(prctl PR_SET_MM_MAP), so what finds, signals and stops processes by pid, command line, group or
socket (node/procs.py, node/server/launcher.py) treats it like an exec'd one.

It is opt-in: `PLANET_ZYGOTE=<socket path>` (the test lanes set it, tests/conftest.py). Without
it, with the zygote gone, or when a request differs from the zygote in anything a fresh
interpreter fixes at start-up (`node.zygote.fit`: interpreter, namespaces, the environment that
libraries read at import, modules that the child's cwd would shadow), the caller starts the
process with `subprocess.Popen` as before.

Modules: `wire` (the messages, parsed), `fit` (whether a request can be served), `cmdline`
(a child's argv and environment in /proc), `child` (what a forked child does), `netns` (`ip
netns exec NS` done by the child), `server` (the zygote's loop), `client` (the caller's side:
`spawn`, `ZygoteChild`), `handoff` (an exec that the zygote's fork stands in for).
"""

ENV_VAR = "PLANET_ZYGOTE"
