"""Generated gRPC/protobuf code for every Assay RPC and message."""
