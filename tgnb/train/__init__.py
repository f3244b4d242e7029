"""tgnb.train"""
