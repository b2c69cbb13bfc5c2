"""BitNet loader: being written."""
def load_bitnet(path): raise NotImplementedError
