"""Environment wrappers. `gym_compat` (gymnasium envs both ways) needs the `gym` extra and is imported on its own:
`from unienv_interface.wrapper.gym_compat import FromGymnasiumEnv, ToGymnasiumEnv`."""
