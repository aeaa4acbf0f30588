"""The NCCL environment of GPU runs: RoCE on or off, plus the fabric settings a user gives.

the SFTTrainer spec ``enable_roce`` ("only in effect for multi-node runs") and the reference actuator
(ado-sfttrainer.md §9) decide ``NCCL_IB_DISABLE``: 0 with RoCE on a multi-node run, else 1 (NCCL falls
back to TCP sockets). Everything else keeps NCCL's own default (auto-detection) unless the measure
option ``nccl_env`` gives it; the values a RoCE v2 fabric usually needs are in ROCE_SETTINGS and
docs/multinode.md. Source of the NCCL defaults: NCCL's environment-variable documentation
(docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tunebench.errors import InputError, has_control_characters, shown

# name -> (NCCL's default when unset, what a RoCE v2 fabric usually sets, what it does)
ROCE_SETTINGS: dict[str, tuple[str, str, str]] = {
    "NCCL_IB_HCA": ("all RDMA devices found", "mlx5 (prefix: every ConnectX port)", "RDMA devices/ports NCCL may use"),
    "NCCL_IB_GID_INDEX": ("auto (NCCL >= 2.21), else 0", "3 (RoCE v2, IPv4-mapped GID)", "GID table entry of the port"),
    "NCCL_SOCKET_IFNAME": ("any interface but lo and docker*", "the pod/host data interface, e.g. net1 or eth0",
                           "interface of the bootstrap and socket traffic"),
    "NCCL_IB_TC": ("0", "106 (DSCP 26, the lossless class of most RoCE switches)", "IB traffic class of RDMA packets"),
    "NCCL_IB_SL": ("0", "site specific", "IB service level"),
    "NCCL_NET_GDR_LEVEL": ("auto (by PCIe topology)", "auto; PHB where GPU and NIC share a PCIe root",
                           "when GPUDirect RDMA is used"),
    "NCCL_DEBUG": ("unset (warnings only)", "INFO to see which transport was chosen", "NCCL log level"),
}  # fmt: skip
DECIDED = "NCCL_IB_DISABLE"  # set from enable_roce, never by the user


NCCL_NAME = re.compile(r"NCCL_[A-Z0-9_]+")  # NCCL's variables (NCCL docs, Environment Variables)


def check_nccl_env(nccl_env: Mapping[str, Any] | None, field: str = "actuator.nccl_env") -> dict[str, str]:
    """The user's NCCL variables as strings; InputError (naming field: the actuator option, or the command
    line's --nccl-env) for a name outside NCCL_* or NCCL_IB_DISABLE."""
    out: dict[str, str] = {}
    for name, value in (nccl_env or {}).items():
        if not str(name).startswith("NCCL_") or name == DECIDED:
            raise InputError(
                field,
                f"{name!r} cannot be set here",
                allowed=f"NCCL_* variables except {DECIDED} (set by enable_roce), e.g. " + ", ".join(ROCE_SETTINGS),
            )
        if not isinstance(value, str | int) or isinstance(value, bool):
            raise InputError(field, f"{name} must be a string or integer, got {shown(value)}")
        if not NCCL_NAME.fullmatch(str(name)) or has_control_characters(str(value)) or len(str(value)) > 4096:
            raise InputError(
                field,
                f"{shown(name)}={shown(value)} is not one line of NAME=VALUE",
                allowed="NCCL_[A-Z0-9_]+ and a value of at most 4,096 printable characters",
            )
        out[str(name)] = str(value)
    return out


def nccl_environment(enable_roce: bool, number_nodes: int, nccl_env: Mapping[str, Any] | None) -> dict[str, str]:
    """NCCL variables of a GPU plan: RoCE decides NCCL_IB_DISABLE; the user's settings are added."""
    env = {DECIDED: "0" if enable_roce and number_nodes > 1 else "1"}
    env.update(check_nccl_env(nccl_env))
    return env
