"""tgnb.emulator"""
