"""An emulated cluster on one machine: hosts with their own NIC, sshd and faults (`hvdtrain cluster`).

topology (the plan, pure) -> emulated (built inside private namespaces) ->
supervisor (PID 1 of the run: command on h1, faults, teardown by the kernel) ->
command (the CLI: options, checks, the step into the namespaces).
"""
