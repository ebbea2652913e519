"""The TorchJob controller: pure planning modules, observe/act adapters and the wiring."""
