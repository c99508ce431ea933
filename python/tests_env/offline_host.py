"""Runs ``python -m petting_env.host`` with the network cut: a test fails if anything downloads.

Every way out (connect, DNS) raises, so a game or dataset that fetches data at run time
(nltk's word lists, a model hub) fails its test instead of passing only while online.
"""

import runpy
import socket


def refuse(*args: object, **kwargs: object) -> None:
    raise OSError("network access is disabled in petting_env's tests")


socket.socket.connect = refuse  # type: ignore[method-assign]
socket.socket.connect_ex = refuse  # type: ignore[method-assign]
socket.getaddrinfo = refuse  # type: ignore[assignment]
socket.create_connection = refuse  # type: ignore[assignment]

runpy.run_module("petting_env.host", run_name="__main__", alter_sys=True)
