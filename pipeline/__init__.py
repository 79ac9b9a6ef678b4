"""The ground floor: canonical table schemas, signals, PromQL and the pure SLI transforms.

Nothing here talks to the network, opens the store or imports another room of the project.
"""
