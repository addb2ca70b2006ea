"""Ports: the server's own port taken, or an internal rendezvous port. What the host says
about the port (who holds it, which one is free) comes in `ctx.ports`, asked once by the
pipeline: advice computes, it does not probe."""

from __future__ import annotations

from .core import Advisor, as_int

# torch's TCPStore and vLLM's get_open_port bind internal rendezvous ports; the API server
# binds --port (uvicorn, or vLLM's create_server_socket)
INTERNAL_PORT_FRAMES = {
    "get_open_port",
    "_create_c10d_store",
    "TCPStore",
    "init_process_group",
    "_init_process_group",
    "rendezvous",
    "init_distributed_environment",
    "_tcp_rendezvous_handler",
}


def taken_port(a: Advisor) -> int | None:
    """The port the finding says is taken (else the one the server was launched on)."""
    return as_int(a.finding.facts.get("port")) or as_int(a.ctx.current("port"))


def port(a: Advisor) -> None:
    f = a.finding
    taken = taken_port(a)
    if taken is None:
        return
    ports = a.ctx.ports
    new = ports.free_after if ports else None
    holder = f.facts.get("holder_pid")
    who = ""
    if holder:
        name = f.facts.get("holder_name")
        who = f" by pid {holder}" + (f" ({name})" if name else "")
    elif ports and ports.holder is not None:  # when the check ran where the server ran
        who = f"; on this host pid {ports.holder[0]} listens on it ({ports.holder[1][:60]})"
    a.add(
        "port",
        new if new is not None else taken + 1,
        f"port {taken} is taken{who}" + (f"; {new} is free on this host now" if new else ""),
        taken,
    )


def free_port_action(a: Advisor) -> None:
    taken = a.finding.facts.get("port")
    a.add(
        "action:free_port",
        f"stop the process holding port {taken}" if taken else "stop leftover server/worker processes",
        "a previous instance (or its workers) still holds the port",
    )


def port_in_use(a: Advisor) -> None:
    f = a.finding
    ports = a.ctx.ports
    named = str(f.facts.get("port_name") or "")
    if named and named != "port":
        # SGLang names the internal port it waited for (nccl_port, dist_init_port, …)
        taken = as_int(f.facts.get("port")) or 0
        new = ports.free_after if ports and taken else None
        a.add(
            "nccl_port" if "nccl" in named else named,
            new if new is not None else "a free port",
            f"SGLang's {named} {taken} is held by another process",
            taken or None,
        )
        free_port_action(a)
        a.complete = True
        return
    internal = f.facts.get("port") is None and (
        bool(a.ctx.frames & INTERNAL_PORT_FRAMES)
        or "server socket has failed to listen" in f.evidence
        or "TCPStore" in f.evidence
    )
    if internal:
        free_port_action(a)
        new = ports.free_rendezvous if ports else None
        a.add(
            "nccl_port" if a.has("nccl_port") else "master_port",
            new if new is not None else "a free port",
            "an internal rendezvous port collides with a leftover process; pin it to a free one",
        )
        a.complete = True
        return
    port(a)
    free_port_action(a)


VALUES = {"port": port, "action:free_port": free_port_action}
CLASSES = {"port_in_use": port_in_use}
