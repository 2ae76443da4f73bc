"""Code that runs inside the sandbox, under bubblewrap, with only the standard library.

The service reads `runner.py`'s source and hands it to `python3 -I -c` inside the
sandbox, where neither the service's packages nor third-party packages exist. So
nothing in this folder may import `rlfleet_sandbox` (or any other rlfleet package) or a
third-party package; the service may import from here (constants, pure helpers).
"""
