"""veRL integration. ``loss`` runs on CPU (veRL as a library); the GPU trainer needs the ``gpu`` extra."""
