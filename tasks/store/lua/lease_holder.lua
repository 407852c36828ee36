-- The turn id holding a conversation's lease, or false.
return lease_holder(K.lease)
