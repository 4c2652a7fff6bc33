from .ddp_safe_cdn_query_generator import (DUMMY_DN_GROUP_KEY,
                                           DDPSafeCdnQueryGenerator)

__all__ = ['DDPSafeCdnQueryGenerator', 'DUMMY_DN_GROUP_KEY']
