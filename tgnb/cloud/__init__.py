"""tgnb.cloud"""
