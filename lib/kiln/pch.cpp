// Empty: the source the precompiled-header target (kiln_pch) needs to exist.
