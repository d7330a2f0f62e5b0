"""The daemon: the socket server and its op table, serving, the trainer process and its
supervisor, metrics and the systemd glue. Nothing outside this package imports it except
the command line (gated.cli)."""
