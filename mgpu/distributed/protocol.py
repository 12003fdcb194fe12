"""Which protocol a cluster speaks: TCP (Dask's default) or UCX, checked before anything
starts.

UCX (through the ``distributed-ucxx`` package, ``pip install 'mgpu[ucx]'``) moves the data
that stays in Dask (a tile sent to another worker, a result gathered) over NVLink, InfiniBand
or shared memory, and GPU buffers without a copy through host memory. It is Dask's
``ucx://`` scheme: an embedded cluster is started with it, and a running scheduler speaks
whatever its address says.
"""
from __future__ import annotations

import importlib.util
import json
import os
import dask.config

from mgpu import config
from mgpu.ops.validation import StrOptions, check_param

__all__ = ["PROTOCOLS", "address_scheme", "check_protocol", "ucx_available"]

# protocol -> what it is, in the words of the refusals and the docs
PROTOCOLS: dict[str, str] = {
    "tcp": "Dask's TCP (TLS when distributed.comm.require-encryption is set)",
    "ucx": "UCX through distributed-ucxx: NVLink, InfiniBand or shared memory between "
           "workers, GPU buffers sent without a copy through host memory",
}

# Dask's scheme of each protocol; distributed-ucxx also answers to its older 'ucxx://'
_SCHEMES = {"tcp": "tcp", "tls": "tcp", "ucx": "ucx", "ucxx": "ucx"}

UCX_INSTALL = ("pip install 'mgpu[ucx]' (distributed-ucxx-cu13 with its ucxx, libucx and rmm "
               "wheels, CUDA 13)")


def ucx_available() -> bool:
    """Whether ``distributed-ucxx`` is installed here, without importing it (its import loads
    libucx)."""
    return importlib.util.find_spec("distributed_ucxx") is not None


def _named(address: str) -> str:
    """The address a scheduler file names ("" for an unreadable one, which distributed
    reports in its own words), or ``address`` itself."""
    if not os.path.isfile(address):
        return address
    try:
        with open(address) as f:
            return str(json.load(f).get("address", ""))
    except (OSError, ValueError, AttributeError):
        return ""


def address_scheme(address: str) -> str:
    """The scheme of a scheduler address (``"ucx"`` of ``"ucx://10.0.0.1:8786"``), of the
    address in a scheduler file, or Dask's default scheme for an address without one."""
    scheme, sep, _ = _named(address).partition("://")
    if not sep:
        return str(dask.config.get("distributed.comm.default-scheme", "tcp"))
    return scheme


def check_protocol(protocol: str | None, address: str | None, *, func: str = "connect"
                   ) -> str | None:
    """``"ucx"`` when a cluster started now (no ``address``) is to speak UCX, None when it
    speaks Dask's default (TCP, or TLS where Dask's config requires encryption) or when
    ``address`` is given (the scheduler speaks its own); a refusal, before anything starts,
    otherwise.

    ``protocol`` None reads ``mgpu.connect.protocol``. Refused: a protocol that is not one of
    :data:`PROTOCOLS`; one, given or set, that differs from the scheme of ``address`` (a
    running scheduler speaks only its own: joining it otherwise would not be what was asked); UCX, asked for or in the address, without ``distributed-ucxx``;
    UCX where Dask's config requires encryption (UCX does not encrypt).
    """
    check_param(protocol, "protocol", func, [StrOptions(PROTOCOLS), None])
    from_config = protocol is None
    if from_config:
        protocol = config.get("connect.protocol")
        if protocol is not None and protocol not in PROTOCOLS:
            raise ValueError(f"The 'protocol' parameter of {func} comes from "
                             "mgpu.connect.protocol, which must be one of "
                             f"{sorted(PROTOCOLS)} or null. Got {protocol!r}.")
    scheme = None if address is None else address_scheme(address)
    speaks = _SCHEMES.get(scheme, scheme) if scheme is not None else None
    if protocol is not None and speaks is not None and speaks != protocol:
        source = " (from mgpu.connect.protocol)" if from_config else ""
        raise ValueError(
            f"The 'protocol' parameter of {func}{source} must match the scheduler's address, "
            f"which speaks {scheme}:// ({_where(address)}). Got protocol={protocol!r}. Leave "
            "protocol out (unset mgpu.connect.protocol) to join it as it is, or start the "
            f"scheduler with --protocol {protocol}.")
    if "ucx" in (protocol, speaks):
        _check_ucx(func, address if speaks == "ucx" else None)
    return "ucx" if protocol == "ucx" and address is None else None


def _where(address: str) -> str:
    named = _named(address)
    return address if named == address else f"{named}, from the scheduler file {address}"


def _check_ucx(func: str, address: str | None) -> None:
    what = (f"The scheduler at {_where(address)} speaks UCX" if address else
            f"The 'protocol' parameter of {func} is 'ucx'")
    if not ucx_available():
        raise ImportError(f"{what}, which needs distributed-ucxx, not installed in this "
                          f"Python: {UCX_INSTALL}.")
    if dask.config.get("distributed.comm.require-encryption", False):
        raise ValueError(f"The 'protocol' parameter of {func} is 'ucx', which does not "
                         "encrypt, but Dask's config sets distributed.comm.require-encryption: "
                         "leave protocol out (TLS over TCP) or unset require-encryption.")
