"""Traces: OTLP/JSON and OTLP/protobuf decoding, request spans, the OTLP receiver and
trace files into the store."""
