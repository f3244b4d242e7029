"""tgnb.notebook"""
