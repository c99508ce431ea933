"""Loading user code (an environment class, a reward function) and describing its errors.

Both are named relative to the run's working directory: ``my_env:MyEnv`` imports the
module ``my_env`` with the directory on ``sys.path``; ``envs/my_env.py:MyEnv`` and
``rewards.py:fn`` load that file. When user code raises, petting shows one line, so
``describe_exception`` names the exception and the frame in the user's own file that
raised it, which is where the user has to look.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

PACKAGE_DIR = Path(__file__).resolve().parent


class UserCodeError(Exception):
    """User code could not be loaded; the message says what and where."""


def split_reference(reference: Any, what: str) -> tuple[str, str]:
    """Split ``module:name`` (or ``file.py:name``) into its two parts."""
    if not isinstance(reference, str) or ":" not in reference:
        raise UserCodeError(f"{what} must be 'module:Name' or 'file.py:Name', got {reference!r}")
    module, _, name = reference.rpartition(":")
    if not module or not name:
        raise UserCodeError(f"{what} must be 'module:Name' or 'file.py:Name', got {reference!r}")
    return module, name


def load_module(module: str, workdir: Path) -> ModuleType:
    """Import ``module``: a dotted module name found from ``workdir``, or a ``.py`` file under it."""
    if module.endswith(".py"):
        path = (workdir / module).resolve()
        if not path.is_file():
            raise UserCodeError(f"no file {path}")
        name = f"petting_user_{path.stem}_{abs(hash(str(path))):x}"
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise UserCodeError(f"cannot load {path} as Python")
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[name] = loaded  # dataclasses and pickling look their module up here
        try:
            spec.loader.exec_module(loaded)
        except Exception as error:
            del sys.modules[name]
            raise UserCodeError(f"importing {path} failed: {describe_exception(error, workdir)}") from error
        return loaded
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name and module.startswith(error.name):
            raise UserCodeError(f"no module {module!r} in {workdir} or on the Python path") from error
        raise UserCodeError(f"importing {module} failed: {describe_exception(error, workdir)}") from error
    except Exception as error:
        raise UserCodeError(f"importing {module} failed: {describe_exception(error, workdir)}") from error


def load_attribute(reference: Any, workdir: Path, what: str) -> Any:
    """The object ``reference`` (``module:name``) names."""
    module, name = split_reference(reference, what)
    loaded = load_module(module, workdir)
    try:
        return getattr(loaded, name)
    except AttributeError:
        raise UserCodeError(f"{what} {reference!r}: {module} has no {name!r}") from None


def load_env_class(reference: Any, workdir: Path) -> type:
    """The environment class ``module:Class`` names; it must have reset, observe and step."""
    env_class = load_attribute(reference, workdir, "env module")
    if not isinstance(env_class, type):
        raise UserCodeError(f"env module {reference!r} is not a class")
    missing = [method for method in ("reset", "observe", "step") if not callable(getattr(env_class, method, None))]
    if missing:
        raise UserCodeError(f"env class {reference!r} lacks {', '.join(missing)}")
    return env_class


def load_reward(reference: Any, workdir: Path) -> Callable[[dict[str, Any], str], Any]:
    """The reward function ``rewards.py:fn`` names, called as ``fn(task, reply)``."""
    function = load_attribute(reference, workdir, "reward")
    if not callable(function):
        raise UserCodeError(f"reward {reference!r} is not a function")
    return function


def user_frame(error: BaseException, user_paths: list[Path]) -> traceback.FrameSummary | None:
    """The frame to blame: the last one in the user's files, else the last outside this package."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return None

    def under(filename: str, directory: Path) -> bool:
        try:
            Path(filename).resolve().relative_to(directory)
            return True
        except ValueError:
            return False

    def installed(filename: str) -> bool:
        return "site-packages" in filename or "dist-packages" in filename

    for frame in reversed(frames):
        in_user_path = any(under(frame.filename, path) for path in user_paths)
        if in_user_path and not installed(frame.filename) and not under(frame.filename, PACKAGE_DIR):
            return frame
    for frame in reversed(frames):
        if not under(frame.filename, PACKAGE_DIR):
            return frame
    return frames[-1]


def describe_exception(error: BaseException, *user_paths: Path | None) -> str:
    """``Type: message (at file:line in function)``, the frame being the user's."""
    message = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    frame = user_frame(error, [Path(path).resolve() for path in user_paths if path is not None])
    if frame is None:
        return message
    return f"{message} (at {os.path.normpath(frame.filename)}:{frame.lineno} in {frame.name})"
