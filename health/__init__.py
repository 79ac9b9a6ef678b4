"""Fleet health: detectors that read the minute frames and name what went wrong, where.

Each detector is a pure function of frames; `detectors` runs them all and `finding` holds their
one result type. Nothing here opens the store or the network.
"""
