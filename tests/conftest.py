"""Suite-wide test settings."""
import os
import tempfile

# builtin:tiny models are cached by (task, config, seed); the suite builds its own in a fresh
# folder so that results never depend on a developer's ~/.cache/brorl.
os.environ.setdefault("BRORL_CACHE_DIR", tempfile.mkdtemp(prefix="brorl-test-cache-"))
