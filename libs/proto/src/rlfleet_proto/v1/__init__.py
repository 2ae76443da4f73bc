"""Generated from protos/rlfleet/v1 by libs/proto/gen_protos.py."""
