"""The boundary between the server's process and the engine core's own: the core's process and its
client, the loop, the messages, the tensor channel."""
