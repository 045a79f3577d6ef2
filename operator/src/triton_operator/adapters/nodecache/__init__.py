"""The node cache: its content-addressed store on the node's disk, its HTTP server and sync's client."""
