"""petting's environment host: train petting's agent teams on Python environments.

petting talks to one long-lived host process over stdin and stdout (JSON lines, see
``petting_env.host``). The host runs TextArena games, reasoning-gym datasets, or a
user's own ``Env`` subclass. Only the standard library is imported here; textarena and
reasoning_gym are imported when an environment names them.
"""

from __future__ import annotations

from .env import Env, StepResult, task_seed

__all__ = ["Env", "StepResult", "serve", "task_seed"]


def serve(env_class: type) -> None:
    """Serve ``env_class`` over stdin and stdout until petting closes stdin.

    Lets a user's script be the host: ``env: {name: external, command: [python,
    my_env.py]}`` with ``if __name__ == "__main__": serve(MyEnv)`` at its end.
    """
    from .host import serve as serve_host  # imported here so `python -m petting_env.host` runs it once

    serve_host(env_class)
