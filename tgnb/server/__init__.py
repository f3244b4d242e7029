"""tgnb.server"""
