import sys
from pathlib import Path

# tests/ helpers (gradcheck.py, ...) import as top-level modules.
sys.path.insert(0, str(Path(__file__).parent))
