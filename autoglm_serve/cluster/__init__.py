"""`autoglm-serve cluster`: engine replicas on Ray Serve behind one OpenAI endpoint, with
requests of one conversation kept on the replica that holds its prefix cache."""
