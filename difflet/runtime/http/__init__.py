"""The OpenAI-compatible HTTP face of the API process (stdlib http.server; torch-free).

It shares the gRPC path's Admission, Dispatcher (one queue), deadlines, cancellation, replicas
and metrics: a request admitted here is the same `Job` a gRPC call would make.
"""
